"""dist-resume: exact, elastic mid-epoch resume for PyTorch training jobs."""

from .checkpoint import (
    CheckpointInfo,
    SaveHandle,
    list_checkpoints,
    load_checkpoint,
    read_loader_states,
    save_checkpoint,
)
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    StorageError,
    UnsafeCheckpointError,
)
from .integrations.lightning import LightningLoader
from .loader import ResumableDataLoader
from .mixtures import Mixture
from .remap import PlannedBatch, ResumePlan, plan_resume
from .sample_rng import sample_generator, sample_seed
from .state import ResumeStateError
from .state_json import state_from_json, state_to_json
from .streams import ShardedStream
from .train_state import TrainState

__all__ = [
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "LightningLoader",
    "Mixture",
    "PlannedBatch",
    "ResumableDataLoader",
    "ResumePlan",
    "ResumeStateError",
    "SaveHandle",
    "ShardedStream",
    "StorageError",
    "TrainState",
    "UnsafeCheckpointError",
    "list_checkpoints",
    "load_checkpoint",
    "plan_resume",
    "read_loader_states",
    "sample_generator",
    "sample_seed",
    "save_checkpoint",
    "state_from_json",
    "state_to_json",
]

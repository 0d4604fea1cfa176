"""dist-resume: exact, elastic mid-epoch resume for PyTorch training jobs."""

from .checkpoint import CheckpointInfo, SaveHandle, list_checkpoints, load_checkpoint, save_checkpoint
from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    StorageError,
    UnsafeCheckpointError,
)
from .loader import ResumableDataLoader
from .remap import PlannedBatch, ResumePlan, plan_resume
from .sharded_stream import ShardedStream
from .state import ResumeStateError

__all__ = [
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "PlannedBatch",
    "ResumableDataLoader",
    "ResumePlan",
    "ResumeStateError",
    "SaveHandle",
    "ShardedStream",
    "StorageError",
    "UnsafeCheckpointError",
    "list_checkpoints",
    "load_checkpoint",
    "plan_resume",
    "save_checkpoint",
]

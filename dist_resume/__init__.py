"""dist-resume: exact, elastic mid-epoch resume for PyTorch training jobs.

The public face: every name a user imports, from the subpackage that owns it (see
ARCHITECTURE.md for the layers).

The checkpoint API is imported on first use: it brings in torch.distributed.checkpoint,
which a DataLoader worker started with spawn or forkserver would otherwise import too.

Importing the package in a worker that torchrun started makes the worker end with torchrun,
even when torchrun is killed with SIGKILL (``end_with_torchrun``; opt out with
``DIST_RESUME_END_WITH_LAUNCHER=0``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# First: a torchrun worker ends with its launcher from as early as possible (G7: one job writes a run).
from dist_resume.process_group import end_with_launcher, end_with_torchrun, shut_down_distributed

end_with_torchrun()

from dist_resume.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    SaveOutcomeUnknownError,
    StorageError,
    UnsafeCheckpointError,
)
from dist_resume.integrations.lightning import LightningLoader
from dist_resume.integrations.torchft import ManagedLoader
from dist_resume.integrations.transformers import ResumableTrainerMixin
from dist_resume.loader import ResumableDataLoader
from dist_resume.mixtures import Mixture
from dist_resume.packing import PackedCollate, PackedDocuments, TokenFile, TokenSequences, collate_packed, packed
from dist_resume.positions import PlannedBatch, ResumePlan, plan_resume
from dist_resume.randomness import sample_generator, sample_seed
from dist_resume.state import ResumeStateError, SkippedRange, state_from_json, state_to_json
from dist_resume.streams import JsonlReader, ParquetReader, ShardCountError, ShardedStream, WebDatasetReader, hf_stream

if TYPE_CHECKING:
    from dist_resume.checkpoint import (
        CheckpointInfo,
        SaveHandle,
        TrainState,
        list_checkpoints,
        load_checkpoint,
        read_loader_states,
        save_checkpoint,
    )

_CHECKPOINT_NAMES = frozenset({"CheckpointInfo", "SaveHandle", "TrainState", "list_checkpoints", "load_checkpoint",
                               "read_loader_states", "save_checkpoint"})


def __getattr__(name: str) -> Any:
    if name in _CHECKPOINT_NAMES:
        value = getattr(importlib.import_module("dist_resume.checkpoint"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dist_resume' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _CHECKPOINT_NAMES)


__all__ = [
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "JsonlReader",
    "LightningLoader",
    "ManagedLoader",
    "Mixture",
    "PackedCollate",
    "PackedDocuments",
    "ParquetReader",
    "PlannedBatch",
    "ResumableDataLoader",
    "ResumePlan",
    "ResumeStateError",
    "ResumableTrainerMixin",
    "SaveHandle",
    "SaveOutcomeUnknownError",
    "ShardCountError",
    "ShardedStream",
    "SkippedRange",
    "StorageError",
    "TokenFile",
    "TokenSequences",
    "TrainState",
    "UnsafeCheckpointError",
    "WebDatasetReader",
    "collate_packed",
    "end_with_launcher",
    "hf_stream",
    "list_checkpoints",
    "load_checkpoint",
    "packed",
    "plan_resume",
    "read_loader_states",
    "sample_generator",
    "sample_seed",
    "save_checkpoint",
    "shut_down_distributed",
    "state_from_json",
    "state_to_json",
]

"""Errors raised by checkpoint saving and loading.

Each carries a single message so that it survives the pickling DCP uses to gather
failures from all ranks.
"""


class CheckpointError(RuntimeError):
    """Base class of the checkpoint errors of dist_resume."""


class StorageError(CheckpointError):
    """The storage behind a checkpoint URL failed or refused a request (G9)."""


class CheckpointNotFoundError(CheckpointError):
    """An explicitly requested step is not committed at the URL."""


class CheckpointExistsError(CheckpointError):
    """A step is already committed; committed steps are never overwritten (G7)."""


class CheckpointCorruptError(CheckpointError):
    """A committed checkpoint is missing data its metadata describes."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint would need more than plain data to unpickle (G8)."""


class SaveOutcomeUnknownError(CheckpointError):
    """A save that cannot tell whether its step is committed (G7, G10): storage stopped
    answering as its marker was created, or rank 0, which commits alone, was lost after this
    rank entered the commit. The step may be committed; ``list_checkpoints`` tells."""

"""Checkpoints: atomic, sharded DCP saves at any URL, elastic loads, listing, and the
safety of reading them (G6-G9). Owns the commit layout (step directories, attempts, the
``.committed`` marker, the run's index), each save's rank table, the writer lease (one job
writes to a run), the collectives around a save, safe unpickling and bounded reads,
and `TrainState` for a model and its optimizer. Imports `storage`, `state` (the loader
state's elastic guard and rank table, and the ranges a loader skipped, on which a save's
ranks must agree), `streams` (the names of a stream's position in a loader entry),
`arguments` and `errors`; never the loader, which it saves only as a DCP Stateful."""

from dist_resume.checkpoint.async_saves import SaveHandle
from dist_resume.checkpoint.load import CheckpointInfo, list_checkpoints, load_checkpoint, read_loader_states
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.checkpoint.train_state import TrainState

__all__ = ["CheckpointInfo", "SaveHandle", "TrainState", "list_checkpoints", "load_checkpoint",
           "read_loader_states", "save_checkpoint"]

"""`ResumableDataLoader` and its parts: the epoch it serves (`epochs`), the batch requests
it sends its inner DataLoader (`requests`, `fetch`), the progress it counts as batches reach
the training loop (`progress`; out of order: `unordered`), the batches it skips unread
(`skipping`), its state (`saving`), per-worker dataset states, the single-process fast path
and its defaults. The top of the data path: imports `streams`, `positions`, `state`,
`randomness` and `workers`; nothing below imports it."""

from dist_resume.loader.resumable import ResumableDataLoader

__all__ = ["ResumableDataLoader"]

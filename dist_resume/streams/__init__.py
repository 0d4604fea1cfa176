"""IterableDatasets in `ResumableDataLoader`: the elastic `ShardedStream` (its shard files
and counts, the canonical streams that read them, the fixed rule of its global steps, the
workers' parts of a batch and their join, its recorded position, its shard counts split
over a job's ranks), the per-worker readers
and the main-process cursor that resumes any stream exactly where its last yielded batch
left off, the checks of a saved stream state, and the step protocol (`steps`) by which a
Mixture of streams is read the same way; a `ShardedStream` read with `in_order=False`
(`unordered_*`: whole batches from each worker's own run of items); the shard formats (`formats/`) and shards
opened ahead (`prefetch`, their first bytes held by `head_file`). Imports `workers`, `positions`, `state`,
`storage`, `randomness`, `errors` and `arguments`; never the loader, which drives it."""

from dist_resume.streams.formats import JsonlReader, ParquetReader, WebDatasetReader, hf_stream
from dist_resume.streams.shard_files import ShardCountError
from dist_resume.streams.sharded import ShardedStream

__all__ = ["JsonlReader", "ParquetReader", "ShardCountError", "ShardedStream", "WebDatasetReader", "hf_stream"]

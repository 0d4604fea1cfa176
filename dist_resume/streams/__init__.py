"""IterableDatasets in `ResumableDataLoader`: the elastic `ShardedStream`, the per-worker
readers and the main-process cursor that resumes any stream exactly where its last yielded
batch left off, and the checks of a saved stream state; the shard formats (`formats/`) and
shards opened ahead (`prefetch`). Imports `workers`, `state`, `storage`, `randomness`,
`errors` and `arguments`; never the loader, which drives it."""

from dist_resume.streams.formats import JsonlReader, ParquetReader, WebDatasetReader, hf_stream
from dist_resume.streams.sharded import ShardedStream

__all__ = ["JsonlReader", "ParquetReader", "ShardedStream", "WebDatasetReader", "hf_stream"]

"""IterableDatasets in `ResumableDataLoader`: the elastic `ShardedStream` (and the step
protocol by which a Mixture of streams is read the same way), the per-worker
readers and the main-process cursor that resumes any stream exactly where its last yielded
batch left off, and the checks of a saved stream state. Imports `workers`, `state`, `storage`,
`randomness` and `arguments`; never the loader, which drives it."""

from dist_resume.streams.shard_files import ShardCountError
from dist_resume.streams.sharded import ShardedStream

__all__ = ["ShardCountError", "ShardedStream"]

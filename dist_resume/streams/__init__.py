"""IterableDatasets in `ResumableDataLoader`: the elastic `ShardedStream`, and the per-worker
cursor that resumes any stream exactly where its last yielded batch left off."""

from .sharded import ShardedStream

__all__ = ["ShardedStream"]

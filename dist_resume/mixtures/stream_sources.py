"""What a Mixture takes as a source: a map-style dataset (its `len`) or a `ShardedStream`
(its items, counted once), and the one `canonical_streams` every stream source is read by."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.utils.data import IterableDataset

from dist_resume.arguments import checked_int
from dist_resume.streams.sharded import MAX_CANONICAL_STREAMS, ShardedStream


def source_length(source: Any) -> int:
    """A source's samples per source-epoch: a stream's items (one pass over its epoch
    order), a map-style dataset's `len`."""
    if isinstance(source, ShardedStream):
        return sum(source.lengths())
    if isinstance(source, IterableDataset):
        raise TypeError(f"Mixture sources are map-style datasets (len and indexing) or ShardedStreams; got "
                        f"{type(source).__name__}, an IterableDataset of another kind, whose order cannot be "
                        "re-partitioned: wrap its shards in a ShardedStream")
    if not hasattr(source, "__len__"):
        raise TypeError(f"Mixture sources are map-style datasets (len and indexing) or ShardedStreams; got "
                        f"{type(source).__name__}, which has no len()")
    return len(source)


def agreed_canonical_streams(sources: Mapping[str, Any], canonical_streams: int | None) -> int | None:
    """The canonical stream count every stream source is read by: `canonical_streams` if
    given, else the one the sources that set it agree on (None: none sets it, the run that
    starts the mixture chooses). A source that sets another value is refused."""
    declared = {name: source.canonical_streams for name, source in sources.items()
                if isinstance(source, ShardedStream) and source.canonical_streams is not None}
    if canonical_streams is not None:
        if not any(isinstance(source, ShardedStream) for source in sources.values()):
            raise ValueError("Mixture canonical_streams applies to ShardedStream sources; this Mixture has none")
        canonical_streams = checked_int("canonical_streams", canonical_streams, 1, MAX_CANONICAL_STREAMS + 1)
        others = {name: value for name, value in declared.items() if value != canonical_streams}
        if others:
            raise ValueError(f"Mixture canonical_streams={canonical_streams} for all its stream sources, but "
                             f"{_describe(others)}: give those sources canonical_streams={canonical_streams} or None")
        return canonical_streams
    if len(set(declared.values())) > 1:
        raise ValueError(f"Mixture stream sources disagree on canonical_streams ({_describe(declared)}): one mixture "
                         "reads all of them by the same canonical streams; give them one value, or pass "
                         "canonical_streams= to Mixture to set it for all")
    return next(iter(declared.values()), None)


def _describe(values: Mapping[str, int]) -> str:
    return ", ".join(f"source {name!r} has canonical_streams={value}" for name, value in values.items())

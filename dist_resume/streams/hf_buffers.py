"""Hugging Face streams whose ``state_dict()`` leaves out what a buffer holds.

``datasets.IterableDataset.shuffle(buffer_size=N)`` draws from a buffer of ``N`` examples
that its ``state_dict()`` does not save: a loader that resumes from that state would lose
the buffered examples and repeat others, silently. So such a stream is refused before it
can be read, with the recipes that resume exactly.
"""

from __future__ import annotations

import sys
from typing import Any


def check_resumable(dataset: Any) -> None:
    """Raise `ValueError` if ``dataset`` is a Hugging Face IterableDataset that shuffles
    through a buffer of more than one example."""
    hf_datasets = sys.modules.get("datasets")  # a datasets.IterableDataset means the package is loaded
    if hf_datasets is None or not isinstance(dataset, getattr(hf_datasets, "IterableDataset", ())):
        return
    size = _largest_buffer(getattr(dataset, "_ex_iterable", None))
    if size > 1:
        raise ValueError(
            f"ResumableDataLoader: this Hugging Face IterableDataset shuffles through a buffer of {size} examples "
            f"(shuffle(buffer_size={size})), which its state_dict() leaves out: a resume would lose and repeat "
            "samples. Use shuffle(seed=..., buffer_size=1), which still shuffles the shard order every epoch, or "
            "read the data files with ShardedStream(..., shuffle=True, window=...), which shuffles the items of "
            "each shard and resumes exactly"
        )


def _largest_buffer(root: Any) -> int:
    """The largest shuffle buffer among the examples iterables that ``root`` reads from."""
    largest, pending, seen = 0, [root], set()
    while pending:
        node = pending.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            largest = max(largest, int(getattr(node, "buffer_size", 0)))
        pending.append(getattr(node, "ex_iterable", None))
        pending.extend(getattr(node, "ex_iterables", None) or ())
    return largest

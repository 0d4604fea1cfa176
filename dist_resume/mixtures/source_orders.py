"""Each source's own order: its `k`-th draw reads position `k % len` of its source-epoch
`k // len`, so no sample of a source repeats before all of it was read."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..order import EpochOrder
from ..seeds import derive_seed

_SOURCE_TAG = 0x737263  # "src"


def name_key(name: str) -> int:
    """An integer that stands for a source name in seeds and digests."""
    return derive_seed(len(name), *name.encode())


class SourceOrders:
    """The orders of every source under a loader's `seed` and `shuffle`: per source-epoch,
    a seeded permutation (`EpochOrder`, seeded per source name) or the identity."""

    def __init__(self, names: Sequence[str], lengths: Sequence[int], seed: int, shuffle: bool) -> None:
        self.lengths = list(lengths)
        self.shuffle = shuffle
        self._seeds = [derive_seed(seed, _SOURCE_TAG, name_key(name)) for name in names]

    def indices(self, sources: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """The index within its source that each draw reads (int64, like `draws`)."""
        result = torch.empty_like(draws)
        lengths = torch.tensor(self.lengths, dtype=torch.int64)[sources]
        epochs, within = draws // lengths, draws % lengths
        if not self.shuffle:
            return within
        for source in torch.unique(sources).tolist():
            of_source = (sources == source).nonzero().squeeze(1)
            source_epochs = epochs[of_source]
            for epoch in torch.unique(source_epochs).tolist():
                chosen = of_source[source_epochs == epoch]
                order = EpochOrder(self.lengths[source], self._seeds[source], epoch, True)
                result[chosen] = torch.tensor(order.indices(within[chosen]), dtype=torch.int64)
        return result

"""Each source's own order: its `k`-th draw reads position `k % len` of its source-epoch
`k // len`, so no sample of a source repeats before all of it was read."""

from __future__ import annotations

from collections.abc import Sequence

import numpy
import torch

from dist_resume.positions.epoch_order import EpochOrder
from dist_resume.randomness.seeds import derive_seed

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

    def position_of(self, source: int, epoch: int, index: int) -> int:
        """Where source `source`'s sample `index` comes in its source-epoch `epoch`."""
        if not self.shuffle:
            return index
        return EpochOrder(self.lengths[source], self._seeds[source], epoch, True).position_of(index)

    def indices(self, sources: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """The index within its source that each draw reads (int64, like `draws`)."""
        # numpy: these arrays are a chunk of positions, where torch's fixed cost per
        # operation would dominate.
        sources_of, draws_of = sources.numpy(), draws.numpy()
        epochs, within = numpy.divmod(draws_of, numpy.array(self.lengths, dtype=numpy.int64)[sources_of])
        if not self.shuffle:
            return torch.from_numpy(within)
        result = numpy.empty_like(draws_of)
        for source in numpy.unique(sources_of).tolist():
            of_source = numpy.flatnonzero(sources_of == source)
            source_epochs = epochs[of_source]
            for epoch in numpy.unique(source_epochs).tolist():
                chosen = of_source[source_epochs == epoch]
                order = EpochOrder(self.lengths[source], self._seeds[source], epoch, True)
                result[chosen] = order.index_array(within[chosen])
        return torch.from_numpy(result)

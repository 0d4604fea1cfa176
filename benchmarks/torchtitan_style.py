"""A minimal packer in the style of torchtitan's HuggingFaceDataset (written for this
project's tests and benchmarks, not copied): each data-parallel slot (rank x worker) reads
its part of the documents, appends each document's tokens to a buffer, and cuts a sequence
of `seq_len + 1` tokens whenever the buffer holds one. Its state is the number of documents
read and the leftover token buffer; a resume passes over the documents read by reading
them again (as `datasets.IterableDataset.skip` does)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

Documents = Callable[[int, int], Iterable[Sequence[int]]]  # (part, parts) -> that part's documents


class BufferPacker(IterableDataset):
    """Sequences of `seq_len + 1` tokens of `documents(slot, slots)`, slot `rank x workers +
    worker` of `world_size x workers`."""

    def __init__(self, documents: Documents, seq_len: int, rank: int = 0, world_size: int = 1) -> None:
        self._documents = documents
        self.seq_len = seq_len
        self._rank, self._world_size = rank, world_size
        self.sample_idx = 0
        self.token_buffer: list[int] = []

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        documents = iter(self._documents(self._rank * workers + worker, self._world_size * workers))
        for _ in itertools.islice(documents, self.sample_idx):  # read again, dropped
            pass
        width = self.seq_len + 1
        for document in documents:
            self.token_buffer.extend(document)
            self.sample_idx += 1
            while len(self.token_buffer) >= width:
                sequence = torch.tensor(self.token_buffer[:width], dtype=torch.int64)
                self.token_buffer = self.token_buffer[width:]
                yield sequence

    def state_dict(self) -> dict[str, Any]:
        return {"sample_idx": self.sample_idx, "token_buffer": list(self.token_buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sample_idx, self.token_buffer = state["sample_idx"], list(state["token_buffer"])

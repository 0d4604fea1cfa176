"""A minimal packer in the style of torchtitan's HuggingFaceDataset (written for these
tests and the benchmarks, not copied): each data-parallel rank reads its split of the
documents (document `i` goes to rank `i % world_size`, as `datasets.split_dataset_by_node`
splits examples), appends each document's tokens to a buffer, and cuts a sequence of
`seq_len + 1` tokens whenever the buffer holds one. Its state is the number of documents
read and the leftover token buffer."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset


class BufferPacker(IterableDataset):
    def __init__(self, documents: Sequence[Sequence[int]], seq_len: int, rank: int, world_size: int) -> None:
        self._documents = list(documents[rank::world_size])
        self.seq_len = seq_len
        self.sample_idx = 0
        self.token_buffer: list[int] = []

    def __iter__(self) -> Iterator[torch.Tensor]:
        width = self.seq_len + 1
        for document in self._documents[self.sample_idx:]:
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

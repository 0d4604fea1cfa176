"""`TokenSequences`: token files read as a map-style dataset of packed sequences."""

from __future__ import annotations

import bisect
import itertools
import operator
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy
from torch.utils.data import Dataset

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.packing.reader import MAX_SEQ_LEN
from dist_resume.packing.sequences import sequence_item
from dist_resume.packing.token_files import OpenedTokens, TokenFile
from dist_resume.positions.epoch_order import EpochOrder
from dist_resume.randomness.seeds import derive_seed
from dist_resume.state.fields import ResumeStateError
from dist_resume.state.saved import SavedStates

_VERSION = 1
_KIND = 0x746F6B656E73  # "tokens": a definition digest no Mixture's equals by design


class TokenSequences(Dataset):
    """The tokens of `files` (`TokenFile`s, or paths of `.npy` files), one after another,
    as sequences of `seq_len + 1` tokens: item `i` is tokens `[i * (seq_len + 1), (i + 1)
    * (seq_len + 1))` of the concatenation (concatenated and cut, as torchtitan and
    Megatron-LM cut them), the last one padded with `pad_id`. Items are the dicts that
    `packed` streams yield (`tokens`, `position_ids` restarting at each document start, a
    file's start included, `num_tokens`), so `collate_packed` batches both.

    Positions are arithmetic, so through `ResumableDataLoader` it is an ordinary map-style
    dataset: exact and elastic resume at any world size and `num_workers`, every sequence
    once per epoch, `shuffle`, `skip`, `in_order=False`, a state of a few integers; the
    state also records `seq_len`, `pad_id` and every file's token count, and a state saved
    with others is refused naming them (G6). Files are memory-mapped in each process that
    reads them (a DataLoader worker, forked or spawned, maps them itself); each file is
    opened and checked once when the dataset is made."""

    def __init__(self, files: Sequence[TokenFile | str | os.PathLike], seq_len: int, *, pad_id: int = 0) -> None:
        if isinstance(files, (str, os.PathLike, TokenFile)):
            files = [files]
        self.files = tuple(file if isinstance(file, TokenFile) else TokenFile(file) for file in files)
        if not self.files:
            raise ValueError("TokenSequences needs at least one token file")
        self.seq_len = checked_int("seq_len", seq_len, 1, MAX_SEQ_LEN + 1)
        self.pad_id = checked_int("pad_id", pad_id, -INT64_LIMIT, INT64_LIMIT)
        self._opened: list[OpenedTokens] | None = [file.open() for file in self.files]
        self.file_tokens = tuple(len(opened.tokens) for opened in self._opened)
        self._bases = list(itertools.accumulate(self.file_tokens, initial=0))
        self.total_tokens = self._bases[-1]

    @property
    def width(self) -> int:
        """Tokens per sequence: `seq_len + 1`."""
        return self.seq_len + 1

    def __len__(self) -> int:
        return -(-self.total_tokens // self.width)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_opened"] = None  # a memory map pickles as a copy of the file: each process maps its own
        return state

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = operator.index(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"TokenSequences index {index} is out of range for {len(self)} sequences")
        index %= len(self)
        opened = self._files()
        low = index * self.width
        high = min(low + self.width, self.total_tokens)
        tokens = numpy.full(self.width, self.pad_id, dtype=numpy.int64)
        starts: list[int] = []
        file = bisect.bisect_right(self._bases, low) - 1
        at = low
        while at < high:
            base = self._bases[file]
            first, stop = at - base, min(high, self._bases[file + 1]) - base
            if first < stop:
                piece = tokens[at - low:at - low + stop - first]
                piece[:] = opened[file].tokens[first:stop]
                starts.append(at - low)
                starts.extend((_document_starts(opened[file], piece, first) + at - low).tolist())
                at += stop - first
            file += 1
        return sequence_item(tokens, starts, high - low)

    def _files(self) -> list[OpenedTokens]:
        if self._opened is None:
            self._opened = [file.open() for file in self.files]
        return self._opened

    # -- the ResumableDataLoader protocol of datasets that own their order (positions.dataset_order)

    def position_order(self, seed: int, epoch: int, shuffle: bool) -> EpochOrder:
        """The loader's own epoch order: a map-style dataset's."""
        return EpochOrder(len(self), seed, epoch, shuffle)

    def definition_state(self) -> list[int]:
        """`[version, seq_len, pad_id, files, tokens of each file]`, saved with the state."""
        return [_VERSION, self.seq_len, self.pad_id, len(self.files), *self.file_tokens]

    def definition_digest(self) -> int:
        return derive_seed(_KIND, *self.definition_state())

    def resume_definition(self, values: list[int] | None, saved: SavedStates,
                          state_dict: Mapping[str, Any]) -> Callable[[], None]:
        """A `ResumeStateError` naming what differs from the token sequences a state was
        saved for (seq_len, pad_id, the files' token counts); else nothing to adopt."""
        if values is None:
            raise ResumeStateError("loader state was saved for another dataset; this loader's dataset is TokenSequences")
        if len(values) < 4 or values[0] != _VERSION or len(values) != 4 + values[3]:
            raise ResumeStateError("loader state's dataset definition is not one of TokenSequences")
        seq_len, pad_id, counts = values[1], values[2], tuple(values[4:])
        if (seq_len, pad_id) != (self.seq_len, self.pad_id):
            raise ResumeStateError(f"loader state was saved for token sequences of seq_len={seq_len}, pad_id={pad_id}; "
                                   f"this TokenSequences has seq_len={self.seq_len}, pad_id={self.pad_id}")
        if counts != self.file_tokens:
            raise ResumeStateError(f"loader state was saved for token files of {sum(counts)} tokens ({len(counts)} "
                                   f"files: {_listed(counts)}); these files hold {self.total_tokens} ({len(self.files)} "
                                   f"files: {_listed(self.file_tokens)})")
        return lambda: None


def _document_starts(opened: OpenedTokens, piece: numpy.ndarray, first: int) -> numpy.ndarray:
    """Where documents start in `piece`, the file's tokens from `first` on, past its first token."""
    if opened.starts is not None:
        starts = opened.starts
        return starts[numpy.searchsorted(starts, first, "right"):numpy.searchsorted(starts, first + len(piece))] - first
    if opened.eos_id is not None:
        return numpy.flatnonzero(piece[:-1] == opened.eos_id) + 1
    return numpy.empty(0, dtype=numpy.int64)


def _listed(counts: Sequence[int]) -> str:
    shown = ", ".join(map(str, counts[:8]))
    return shown + (", ..." if len(counts) > 8 else "")

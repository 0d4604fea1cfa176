"""Token files as they are stored for pretraining: a flat array of token ids on local
disk (numpy `.npy`, a raw `.bin` of a given dtype, or Megatron-LM's `.bin` + `.idx`),
with the documents' boundaries (an EOS token id, an array of document start offsets, or
Megatron's index), memory-mapped when read."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy

from dist_resume.arguments import checked_int
from dist_resume.packing.megatron_index import read_index

_LOCAL = "file://"


class OpenedTokens(NamedTuple):
    """A token file's tokens (memory-mapped) and its documents' start offsets (None: no
    offsets; with `eos_id`, a document starts after each EOS token)."""

    tokens: numpy.ndarray
    starts: numpy.ndarray | None
    eos_id: int | None


@dataclass(frozen=True)
class TokenFile:
    """One file of token ids, read in place (memory-mapped: a local path).

    - `path`: a `.npy` file (a 1-D integer array; `dtype`, if given, must be its dtype) or
      a raw file of `dtype` tokens (`"uint16"`, `"int32"`, ...), such as nanoGPT's `.bin`.
    - Document boundaries, at most one of: `eos_id` (each document ends with this token, as
      nanoGPT's and OLMo-core's files keep them), `document_starts` (a `.npy` of the token
      offsets where documents start, in order); neither: the file is one document.
    - `TokenFile.megatron(prefix)`: Megatron-LM's `prefix.bin` with its `prefix.idx`, whose
      documents are its boundaries.
    The file is read only when opened (`open`), so that a dataset holding it pickles small
    and each DataLoader worker maps the file itself."""

    path: str
    dtype: str | None = None
    eos_id: int | None = None
    document_starts: str | None = None
    megatron_index: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise TypeError(f"a token file's path must be a str or a path, got {type(self.path).__name__}")
        path = os.fspath(self.path)
        if path.startswith(_LOCAL):
            path = path[len(_LOCAL):]
        elif "://" in path:
            raise ValueError(f"token files are memory-mapped, so they must be local paths; {path!r} is not one "
                             "(stream remote shards of documents with a ShardedStream and packed())")
        object.__setattr__(self, "path", path)
        if self.eos_id is not None:
            object.__setattr__(self, "eos_id", checked_int("eos_id", self.eos_id, 0))
        kinds = [self.eos_id is not None, self.document_starts is not None, self.megatron_index is not None]
        if sum(kinds) > 1:
            raise ValueError(f"token file {path}: give its document boundaries one way (eos_id, document_starts or "
                             "a Megatron index), not several")
        if self.dtype is not None and numpy.dtype(self.dtype).kind not in "iu":
            raise ValueError(f"token file {path}: dtype {self.dtype!r} is not an integer dtype")

    @classmethod
    def megatron(cls, prefix: str) -> TokenFile:
        """Megatron-LM's indexed dataset `prefix.bin` + `prefix.idx` (built by its
        `preprocess_data.py`), read without Megatron (see `megatron_index`)."""
        return cls(f"{prefix}.bin", megatron_index=f"{prefix}.idx")

    def open(self) -> OpenedTokens:
        """The file memory-mapped, every boundary checked: a `ValueError` naming the file
        for a missing dtype, a size that is not whole tokens, a dtype other than the file's,
        or document offsets that do not increase within the file."""
        starts = None
        if self.megatron_index is not None:
            index = read_index(self.megatron_index)
            tokens = self._mapped(index.dtype)
            if len(tokens) != index.tokens:
                raise ValueError(f"token file {self.path} holds {len(tokens)} tokens; its index "
                                 f"{self.megatron_index} says {index.tokens}")
            starts = index.document_starts
        elif self.path.endswith(".npy"):
            tokens = numpy.load(self.path, mmap_mode="r", allow_pickle=False).view(numpy.ndarray)
            if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
                raise ValueError(f"token file {self.path} holds a {tokens.dtype} array of shape {tokens.shape}, not "
                                 "a 1-D array of integer token ids")
            if self.dtype is not None and numpy.dtype(self.dtype) != tokens.dtype:
                raise ValueError(f"token file {self.path} holds {tokens.dtype} tokens, not {self.dtype}")
        elif self.dtype is None:
            raise ValueError(f"token file {self.path} is not a .npy file: give the dtype of its tokens "
                             "(dtype='uint16', say)")
        else:
            tokens = self._mapped(numpy.dtype(self.dtype))
        if self.document_starts is not None:
            starts = numpy.load(self.document_starts, allow_pickle=False)
        return OpenedTokens(tokens, None if starts is None else self._checked_starts(starts, len(tokens)), self.eos_id)

    def _mapped(self, dtype: numpy.dtype) -> numpy.ndarray:
        size = os.path.getsize(self.path)
        if size % dtype.itemsize:
            raise ValueError(f"token file {self.path} has {size} bytes, not a whole number of {dtype} tokens")
        # a plain array over the map: numpy.memmap's bookkeeping on every slice costs more than the slice
        return numpy.memmap(self.path, dtype, mode="r").view(numpy.ndarray) if size else numpy.empty(0, dtype)

    def _checked_starts(self, starts: numpy.ndarray, count: int) -> numpy.ndarray:
        where = self.document_starts or self.megatron_index
        if starts.ndim != 1 or starts.dtype.kind not in "iu":
            raise ValueError(f"document starts {where} hold a {starts.dtype} array of shape {starts.shape}, not a 1-D "
                             "array of integer token offsets")
        starts = starts.astype(numpy.int64)
        if len(starts) and (starts[0] < 0 or (numpy.diff(starts) < 0).any() or starts[-1] > count):
            raise ValueError(f"document starts {where} are not in order within the file's {count} tokens")
        return numpy.unique(starts[starts < count])  # a start repeated, or at the end, begins an empty document

"""A batch's small tensors sent from a worker process to the main process by value.

torch sends every tensor of a worker's batch as a shared-memory file descriptor, handed over
on a socket of its own: a fixed cost per tensor that, for the few small tensors of a typical
batch of labels, indices or token ids, is most of what the batch costs to deliver. A tensor
whose storage is small enough travels inside the batch's pickle instead; the main process
receives the same values, dtypes, shapes, strides and storage offsets, and tensors of the
batch that shared a storage still share one. Larger tensors, and tensors of any kind this
does not rebuild exactly (not a plain dense CPU tensor, or one that requires grad, is
quantized or named), go torch's way. A tensor with a conjugate or negative bit arrives
resolved: torch's way would drop the bit and deliver other values.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

# A storage up to this size is sent by value. Measured with 2 workers (one-tensor batches):
# by value costs the main process and the workers about half of torch's way up to 16 KiB,
# less up to 64 KiB, about the same at 256 KiB and twice as much at 1 MiB.
SMALL_STORAGE_BYTES = 64 * 1024


def by_value(collate_fn: Callable[[Any], Any], num_workers: int) -> Callable[[Any], Any]:
    """The inner DataLoader's `collate_fn`: with workers, its batches' small tensors sent by value."""
    return ByValueCollate(collate_fn) if num_workers else collate_fn


class ByValueCollate:
    """A worker's `collate_fn` whose batches reach the main process unchanged, small tensors
    sent by value (see the module)."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> Any:
        return _Batch(self.collate_fn(samples))


class _Batch:
    """A batch on its way to the main process: it unpickles as the batch itself."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __reduce__(self) -> tuple:
        buffer = io.BytesIO()
        _SmallTensorPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(self.batch)
        return _unpickled, (buffer.getvalue(),)


def _itself(obj: Any) -> Any:
    return obj


def _unpickled(data: bytes) -> Any:
    return ForkingPickler.loads(data)


class _SmallTensorPickler(ForkingPickler):
    """torch's worker pickler, but a small plain tensor goes with its storage's bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # By address and size: tensors that share a storage share it again. Storages made over
        # the same memory (numpy views that start together) share an address, not a size.
        self._storages: dict[tuple[int, int], _StorageBytes] = {}

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not torch.Tensor:
            return NotImplemented
        if obj.is_conj() or obj.is_neg():
            # torch's way sends the memory without the bit: the main process would see the
            # values unconjugated. Resolved, the values arrive right (a copy, not a view).
            return _itself, (obj.resolve_conj().resolve_neg(),)
        if not _rebuilt_exactly(obj):
            return NotImplemented
        storage = obj.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes > SMALL_STORAGE_BYTES:
            return NotImplemented
        key = (storage.data_ptr(), nbytes)
        sent = self._storages.get(key) if key[0] else None
        if sent is None:
            sent = _StorageBytes(torch.empty((0,), dtype=torch.uint8).set_(storage).numpy().tobytes())
            if key[0]:
                self._storages[key] = sent
        return _tensor, (sent, obj.dtype, obj.storage_offset(), tuple(obj.shape), obj.stride())


def _rebuilt_exactly(tensor: torch.Tensor) -> bool:
    """Whether `_tensor` rebuilds `tensor` with everything it carries."""
    return (tensor.device.type == "cpu" and tensor.layout is torch.strided and not tensor.is_nested
            and not tensor.requires_grad and not tensor.is_quantized
            and not any(getattr(tensor, "names", ())))  # names: gone from recent torch


class _StorageBytes:
    """A storage's bytes, rebuilt as one storage however many tensors of the batch view it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple:
        return _storage, (self.data,)


def _storage(data: bytes) -> torch.UntypedStorage:
    if not data:
        return torch.UntypedStorage(0)
    return torch.UntypedStorage.from_buffer(data, dtype=torch.uint8)


def _tensor(storage: torch.UntypedStorage, dtype: torch.dtype, offset: int, size: tuple[int, ...],
            stride: tuple[int, ...]) -> torch.Tensor:
    return torch.empty((0,), dtype=dtype).set_(storage, offset, size, stride)

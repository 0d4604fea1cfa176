"""The process-global generators a sample may draw from (torch's CPU generator, `random`,
numpy's legacy global generator): seeding, and snapshots cheap enough to take around every
batch, which tell whether a fetch drew from a generator and give the caller its state back.

A snapshot copies the generator's state straight from its memory (about 0.1 us) when the
memory layout was found and checked when the process first used the generator (draws
change the copy, the copy restores the state exactly); otherwise it goes through the
generator's public state API (1-40 us)."""

from __future__ import annotations

import ctypes
import functools
import pickle
import random
import struct
from collections.abc import Callable
from typing import Any

import numpy.random
import torch

NAMES = ("torch", "random", "numpy")

_MT_WORDS = 624
# torch's at::mt19937 data (`uint64 seed; int left; bool seeded; uint32 next; uint32 state[624]`),
# then the cached normal samples (`optional<float>`, `optional<double>`) of CPUGeneratorImpl.
_TORCH_ENGINE = struct.Struct(f"=Qi?3xI{_MT_WORDS}I4x8x16x")
_TORCH_LEGACY = struct.Struct(f"=QiiQ{_MT_WORDS}Q")  # the head of get_state()'s bytes
_TORCH_SCAN = 512  # bytes of the generator object searched for the engine
# CPython's RandomObject: PyObject_HEAD, then `int index; uint32_t state[624]`.
_RANDOM_LAYOUT = struct.Struct(f"=i{_MT_WORDS}I")
# numpy's mt19937_state: `uint32_t key[624]; int pos`.
_NUMPY_LAYOUT = struct.Struct(f"={_MT_WORDS}Ii")
_NUMPY_GAUSS = struct.Struct("=i4xd")  # RandomState's aug_bitgen_t: `int has_gauss; double gauss`


def _view(address: int, size: int) -> ctypes.Array:
    return (ctypes.c_char * size).from_address(address)


class Generator:
    """One global generator: `seed(s)` before a sample, `snapshot()` / `restore()` around a batch.

    Two snapshots compare equal exactly when the generator's state is the same. When its
    memory layout was found, `views` are live views of the state's memory and `extra` reads
    the rest of it (None: nothing else); the snapshot is then `(bytes of views, extra())`,
    so that several generators can be snapshotted by one copy (see `joint_snapshot`).
    """

    name: str
    seed: Callable[[int], None]
    snapshot: Callable[[], Any]
    views: tuple[memoryview, ...] = ()
    extra: Callable[[], Any] | None = None

    def restore(self, snapshot: Any) -> None:
        raise NotImplementedError


class TorchGenerator(Generator):
    name = "torch"

    def __init__(self) -> None:
        self._generator = torch.default_generator
        # torch.manual_seed would also seed every accelerator generator (100x slower);
        # samples are produced by CPU code.
        self.seed = self._generator.manual_seed
        self._engine = self._find_engine()
        if self._engine is not None:
            self.views = (memoryview(self._engine),)
            self.snapshot = lambda engine=self._engine: (engine.raw, None)
        else:
            self.snapshot = lambda: self._generator.get_state().numpy().tobytes()

    def restore(self, snapshot: Any) -> None:
        if self._engine is not None:
            raw, _ = snapshot
            ctypes.memmove(self._engine, raw, len(raw))
        else:
            self._generator.set_state(torch.frombuffer(bytearray(snapshot), dtype=torch.uint8))

    def _find_engine(self) -> ctypes.Array | None:
        generator = self._generator
        saved = generator.get_state()
        try:
            generator.manual_seed(0x5EED5EED)
            torch.rand(7)
            seed, left, _, next_, *words = _TORCH_LEGACY.unpack_from(generator.get_state().numpy().tobytes())
            impl = ctypes.c_void_p.from_address(id(generator) + object.__basicsize__).value
            if not impl:
                return None
            for offset in range(0, _TORCH_SCAN, 8):
                if ctypes.c_uint64.from_address(impl + offset).value != seed:
                    continue
                engine = _view(impl + offset, _TORCH_ENGINE.size)
                found = _TORCH_ENGINE.unpack(engine.raw)
                if found[:2] == (seed, left) and found[3:] == (next_, *(word & 0xFFFFFFFF for word in words)):
                    return engine if self._restores(engine) else None
            return None
        finally:
            generator.set_state(saved)

    def _restores(self, engine: ctypes.Array) -> bool:
        """Every kind of draw changes the copy, and writing the copy back restores the state."""
        draws = (lambda: torch.rand(3), lambda: torch.randn(1), lambda: torch.randn(1, dtype=torch.float64),
                 lambda: torch.randn(20), lambda: torch.randint(0, 10, (2,)))
        for draw in draws * 2:
            copy, state = engine.raw, self._generator.get_state()
            draw()
            if engine.raw == copy:
                return False
            ctypes.memmove(engine, copy, len(copy))
            if not torch.equal(self._generator.get_state(), state):
                return False
            draw()
        return True


class RandomGenerator(Generator):
    """`random`'s hidden instance (its Twister in the C object, `gauss_next` in Python)."""

    name = "random"

    def __init__(self) -> None:
        self._instance = random._inst
        twister = self._twister = _view(id(self._instance) + object.__basicsize__, _RANDOM_LAYOUT.size)
        self._raw = self._layout_matches(twister) and _writes_back(
            (twister,), random.getstate, random.setstate, lambda: random.getrandbits(32 * 700))
        if self._raw:
            self.views = (memoryview(twister),)
            self.extra = functools.partial(getattr, self._instance, "gauss_next")
            self.snapshot = lambda: (twister.raw, self._instance.gauss_next)
        else:
            self.snapshot = random.getstate

    def seed(self, seed: int) -> None:
        random.seed(seed)

    @staticmethod
    def _layout_matches(twister: ctypes.Array) -> bool:
        saved = random.getstate()
        try:
            random.seed(0x5EED)
            for _ in range(3):
                index, *words = _RANDOM_LAYOUT.unpack(twister.raw)
                if (*words, index) != random.getstate()[1]:
                    return False
                random.getrandbits(32 * 700)
            return True
        finally:
            random.setstate(saved)

    def restore(self, snapshot: Any) -> None:
        if not self._raw:
            random.setstate(snapshot)
            return
        raw, gauss_next = snapshot
        ctypes.memmove(self._twister, raw, len(raw))  # setstate's tuple of 625 ints costs 100x more
        self._instance.gauss_next = gauss_next


class NumpyGenerator(Generator):
    """numpy's legacy global `RandomState`: its Twister through the bit generator's ctypes
    interface, and its cached Gaussian (which a draw can consume without touching the
    Twister) from the object, at an offset found and checked at start-up."""

    name = "numpy"

    def __init__(self) -> None:
        self._state = numpy.random.mtrand._rand
        twister = self._twister = _view(self._state._bit_generator.ctypes.state_address, _NUMPY_LAYOUT.size)
        gauss = self._gauss = self._find_gauss(twister)
        self._raw = gauss is not None and _writes_back(
            (twister, gauss), self._state.get_state, self._state.set_state,
            lambda: (self._state.standard_normal(), self._state.random_sample(700)))
        if gauss is not None:
            self.views = (memoryview(twister), memoryview(gauss))
            self.snapshot = lambda: (twister.raw + gauss.raw, None)
        else:
            self.snapshot = self._public_snapshot

    def seed(self, seed: int) -> None:
        self._state.seed(seed & 0xFFFFFFFF)  # the legacy generator takes 32-bit seeds

    def _public_snapshot(self) -> tuple:
        _, key, pos, has_gauss, gauss = self._state.get_state()
        return key.tobytes(), pos, has_gauss, gauss

    def _find_gauss(self, twister: ctypes.Array) -> ctypes.Array | None:
        state = self._state
        saved = state.get_state()
        try:
            state.seed(0x5EED)
            state.random_sample()
            *words, pos = _NUMPY_LAYOUT.unpack(twister.raw)
            _, key, expected_pos, _, _ = state.get_state()
            if words != key.tolist() or pos != expected_pos:
                return None
            state.standard_normal()
            cached = state.get_state()[4]
            size = type(state).__basicsize__
            raw = ctypes.string_at(id(state), size)
            found = [offset - 8 for offset in range(8, size - 7, 8) if raw[offset : offset + 8] == struct.pack("=d", cached)]
            if len(found) != 1:
                return None
            gauss = _view(id(state) + found[0], _NUMPY_GAUSS.size)
            if _NUMPY_GAUSS.unpack(gauss.raw) != (1, cached):
                return None
            state.standard_normal()
            return gauss if _NUMPY_GAUSS.unpack(gauss.raw)[0] == 0 else None
        finally:
            state.set_state(saved)

    def restore(self, snapshot: Any) -> None:
        if self._raw:  # set_state's conversions cost 100x more
            raw, _ = snapshot
            ctypes.memmove(self._twister, raw, _NUMPY_LAYOUT.size)
            ctypes.memmove(self._gauss, raw[_NUMPY_LAYOUT.size:], _NUMPY_GAUSS.size)
            return
        key, pos, has_gauss, gauss = snapshot
        self._state.set_state(("MT19937", numpy.frombuffer(key, dtype=numpy.uint32), pos, has_gauss, gauss))


def _writes_back(memory: tuple[ctypes.Array, ...], get_state: Callable[[], Any], set_state: Callable[[Any], None],
                 draw: Callable[[], Any]) -> bool:
    """Whether writing a copy of `memory` back restores the state the generator's public API
    reports, after `draw`."""
    saved = get_state()
    try:
        for _ in range(3):
            copies, state = [part.raw for part in memory], get_state()
            draw()
            for part, copy in zip(memory, copies):
                ctypes.memmove(part, copy, len(copy))
            # pickle, not repr: the same comparison of numpy's 624 words without formatting them
            # (repr took ~40 ms, once per process, before a process's first batch)
            if pickle.dumps(get_state()) != pickle.dumps(state):
                return False
            draw()
        return True
    finally:
        set_state(saved)


_GENERATORS: dict[str, Generator] = {}
_KINDS: dict[str, type[Generator]] = {"torch": TorchGenerator, "random": RandomGenerator, "numpy": NumpyGenerator}


def generators(names: tuple[str, ...]) -> list[Generator]:
    """The generators named, made (and their layouts checked) once per process."""
    for name in names:
        if name not in _GENERATORS:
            _GENERATORS[name] = _KINDS[name]()
    return [_GENERATORS[name] for name in names]


def joint_snapshot(watched: list[Generator]) -> tuple[Callable[[], Any], Callable[[Any], list[Any]]] | None:
    """One call that snapshots every generator of `watched` by a single copy of their
    memory, and what splits its result into each one's `snapshot()`; None unless every
    one's layout was found. Taken twice per batch: the copy is the floor of its cost."""
    if not watched or not all(generator.views for generator in watched):
        return None
    views = [view for generator in watched for view in generator.views]
    extras = [generator.extra for generator in watched if generator.extra is not None]
    join = b"".join
    if not extras:
        snapshot: Callable[[], Any] = lambda: (join(views), ())
    elif len(extras) == 1:
        (only,) = extras
        snapshot = lambda: (join(views), (only(),))
    else:
        snapshot = lambda: (join(views), tuple(extra() for extra in extras))
    sizes = [sum(view.nbytes for view in generator.views) for generator in watched]

    def split(joint: Any) -> list[Any]:
        raw, extra_values = joint
        values = iter(extra_values)
        parts, offset = [], 0
        for generator, size in zip(watched, sizes):
            parts.append((raw[offset : offset + size], next(values) if generator.extra is not None else None))
            offset += size
        return parts

    return snapshot, split

"""Loader states as JSON text, and back, exactly (G1): for stores that keep JSON, and for
code written for torchdata's JSON-serializable states. The DCP form stays int64 tensors."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import torch

from dist_resume.state.fields import ResumeStateError

_TENSOR, _ITEMS, _TUPLE = "__tensor__", "__items__", "__tuple__"
_MARKERS = {_TENSOR, _ITEMS, _TUPLE}


def state_to_json(state_dict: Mapping[str, Any]) -> str:
    """`ResumableDataLoader.state_dict()` (or a merge of several ranks') as JSON text;
    `state_from_json` gives back an equal state (tensors with their dtype and shape)."""
    return json.dumps(_encode(state_dict, "state"))


def state_from_json(text: str) -> dict[str, Any]:
    """The state dict that `state_to_json` wrote, ready for `load_state_dict`. Text that
    `state_to_json` cannot have written is one `ResumeStateError` saying where."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ResumeStateError(f"loader state JSON cannot be read: {exc}") from None
    try:
        state = _decode(value, "state")
    except RecursionError:
        raise ResumeStateError("loader state JSON is nested deeper than any state") from None
    if not isinstance(state, dict):
        raise ResumeStateError(f"loader state JSON holds {_a(value)}, not a state dict")
    return state


def _encode(value: Any, path: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return {_TENSOR: dtype, "shape": list(value.shape), "values": value.detach().cpu().reshape(-1).tolist()}
    if isinstance(value, Mapping):
        if all(isinstance(key, str) for key in value) and not _MARKERS & set(value):
            return {key: _encode(item, f"{path}[{key!r}]") for key, item in value.items()}
        return {_ITEMS: [[_encode(key, path), _encode(item, f"{path}[{key!r}]")] for key, item in value.items()]}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(item, f"{path}[{i}]") for i, item in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise TypeError(f"loader state value at {path} is a {type(value).__name__}, which has no JSON form")


def _a(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _decode(value: Any, path: str) -> Any:
    if isinstance(value, list):
        return [_decode(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, dict):
        return value
    markers = _MARKERS & set(value)
    if not markers:
        return {key: _decode(item, f"{path}[{key!r}]") for key, item in value.items()}
    if len(markers) > 1 or (_TENSOR not in value and len(value) > 1):
        raise ResumeStateError(f"loader state JSON at {path} mixes the keys {sorted(value)}")
    if _TENSOR in value:
        return _tensor(value, path)
    items = value.get(_ITEMS, value.get(_TUPLE))
    if not isinstance(items, list):
        raise ResumeStateError(f"loader state JSON at {path} holds {_a(items)} where a list belongs")
    if _TUPLE in value:
        return tuple(_decode(item, f"{path}[{i}]") for i, item in enumerate(items))
    decoded = {}
    for i, pair in enumerate(items):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ResumeStateError(f"loader state JSON at {path}[{i}] is not a [key, value] pair")
        key = _hashable(_decode(pair[0], f"{path}[{i}]"))
        try:
            decoded[key] = _decode(pair[1], f"{path}[{key!r}]")
        except TypeError:
            raise ResumeStateError(f"loader state JSON at {path}[{i}] has a key that cannot be one") from None
    return decoded


_INTEGERS = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64}


def _tensor(value: dict[str, Any], path: str) -> torch.Tensor:
    if set(value) != {_TENSOR, "shape", "values"}:
        raise ResumeStateError(f"loader state JSON at {path} has the keys {sorted(value)}, a tensor's are "
                               f"{sorted((_TENSOR, 'shape', 'values'))}")
    name, shape, values = value[_TENSOR], value["shape"], value["values"]
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ResumeStateError(f"loader state JSON at {path} names an unknown tensor dtype {name!r}")
    if not (isinstance(shape, list) and all(type(size) is int and size >= 0 for size in shape)):
        raise ResumeStateError(f"loader state JSON at {path} has the shape {shape!r}, not a list of sizes")
    if not isinstance(values, list) or len(values) != math.prod(shape):
        raise ResumeStateError(f"loader state JSON at {path} holds {_count(values)} for the shape {shape}")
    if dtype in _INTEGERS:
        limits = torch.iinfo(dtype)
        fits = all(type(v) is int and limits.min <= v <= limits.max for v in values)
    elif dtype == torch.bool:
        fits = all(type(v) is bool for v in values)
    else:
        fits = dtype.is_floating_point and all(type(v) in (int, float) for v in values)
    if not fits:
        raise ResumeStateError(f"loader state JSON at {path} holds values that are not {dtype} values")
    try:
        return torch.tensor(values, dtype=dtype).reshape(shape)
    except (RuntimeError, TypeError, ValueError) as exc:  # a dtype torch cannot build from numbers
        raise ResumeStateError(f"loader state JSON at {path}: {exc}") from None


def _count(values: Any) -> str:
    return f"{len(values)} values" if isinstance(values, list) else _a(values)


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key

"""Loader states as JSON text, and back, exactly (G1): for stores that keep JSON, and for
code written for torchdata's JSON-serializable states. The DCP form stays int64 tensors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

_TENSOR, _ITEMS, _TUPLE = "__tensor__", "__items__", "__tuple__"
_MARKERS = {_TENSOR, _ITEMS, _TUPLE}


def state_to_json(state_dict: Mapping[str, Any]) -> str:
    """`ResumableDataLoader.state_dict()` (or a merge of several ranks') as JSON text;
    `state_from_json` gives back an equal state (tensors with their dtype and shape)."""
    return json.dumps(_encode(state_dict, "state"))


def state_from_json(text: str) -> dict[str, Any]:
    """The state dict that `state_to_json` wrote, ready for `load_state_dict`."""
    return _decode(json.loads(text))


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


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    if _TENSOR in value:
        dtype = getattr(torch, value[_TENSOR], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"loader state JSON names an unknown tensor dtype {value[_TENSOR]!r}")
        return torch.tensor(value["values"], dtype=dtype).reshape(value["shape"])
    if _ITEMS in value:
        return {_hashable(_decode(key)): _decode(item) for key, item in value[_ITEMS]}
    if _TUPLE in value:
        return tuple(_decode(item) for item in value[_TUPLE])
    return {key: _decode(item) for key, item in value.items()}


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key

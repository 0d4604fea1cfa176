"""The dtypes a checkpoint may name in ``torch``'s namespace, looked up without running code.

``getattr(torch, name)`` imports some submodules on first access (``torch._inductor``,
``torch._dynamo``, ``torch.onnx``: hundreds of modules), so a refused name would run code
before it is refused (G8). The dtypes are read once from the namespace as it stands.
"""

from __future__ import annotations

import torch

_DTYPES = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}


def dtype_named(name: str) -> torch.dtype | None:
    """The dtype ``torch.<name>``, or None if ``name`` names anything else (or nothing)."""
    return _DTYPES.get(name)

"""Checks of the caller's arguments: a wrong type or value is one clear error naming it.

Numbers of any numeric type (numpy scalars, 0-d torch tensors) are taken wherever torch's
DataLoader takes them and converted here, once, to the Python number they equal; past this
boundary the library computes with Python ints (a numpy seed would overflow its hashing).
Bools are not numbers here and nothing else is converted (``"400"`` is refused, and
``400.0`` is not an int): a careless argument must fail, never silently mean something else.
"""

from __future__ import annotations

import math
import operator
import os
import re
from fractions import Fraction
from numbers import Integral, Rational, Real

import torch

from dist_resume.storage import redact_url

# Seeds and epochs are saved as int64 and hashed as 63-bit values.
INT64_LIMIT = 2**63
# A scheme (two letters or more: "C:" is a drive) not followed by "//": a valid local path
# that a careless URL would silently turn into ("s3:/bucket/run" is ./s3:/bucket/run).
_MALFORMED_SCHEME = re.compile(r"([a-zA-Z][\w+.-]+):(/?)(?!/)(.*)", re.DOTALL)


def _scalar(value: object) -> object:
    """A 0-d non-bool tensor as the Python number it holds; anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype != torch.bool:
        return value.item()
    return value


def checked_int(name: str, value: object, minimum: int, below: int | None = None) -> int:
    """``value`` as a Python int in ``[minimum, below)`` (``below=None``: no upper bound).
    Numpy integers and 0-d integer tensors are integers; TypeError for bools, floats,
    strings and other non-integers, ValueError outside the range."""
    try:
        number = _scalar(value)
        if isinstance(number, bool) or isinstance(value, torch.Tensor) and number is value:
            raise TypeError
        number = operator.index(number)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if below is not None and not minimum <= number < below:
        shown = "2**63" if below == INT64_LIMIT else str(below)
        raise ValueError(f"{name} must be in [{minimum}, {shown}), got {number}")
    if number < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {number}")
    return number


def checked_weight(value: object) -> int | Fraction | float:
    """A mixture weight as a Python int, Fraction or float (a numpy or 0-d tensor float is
    the float it equals); ValueError for bools, non-numbers, NaN, infinities and negatives."""
    number = _scalar(value)
    if isinstance(number, Integral) and not isinstance(number, bool):
        number = operator.index(number)
    elif isinstance(number, Real) and not isinstance(number, (bool, Rational)):
        number = float(number)
    if isinstance(number, bool) or not isinstance(number, (int, Fraction, float)) or not math.isfinite(number) \
            or number < 0:
        raise ValueError(f"mixture weights must be finite numbers >= 0, got {value!r}")
    return number


def checked_flag(name: str, value: object) -> bool:
    """``value`` if it is a bool; TypeError otherwise (``"no"`` is not False)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def checked_url(value: object) -> str:
    """``value`` (a str or path) as text; TypeError for anything else, ValueError for a URL
    that is blank or starts or ends with whitespace (it would name a different place)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"url must be a str or a path, got {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise TypeError(f"url must be a str or a path, got {type(text).__name__}")
    if not text.strip():
        raise ValueError(f"url must name a checkpoint location, got {text!r}")
    if text != text.strip():
        raise ValueError(f"url must not start or end with whitespace, got {text.replace(text.strip(), redact_url(text.strip()))!r}")
    malformed = _MALFORMED_SCHEME.match(text)
    if malformed:
        scheme, slashes, rest = malformed.groups()
        meant = redact_url(f"{scheme}://{slashes if scheme == 'file' else ''}{rest}")
        raise ValueError(f"url starts with '{scheme}:{slashes}', not '{scheme}://': did you mean {meant!r}? "
                         "(a local path whose first part holds a colon must start with './')")
    return text

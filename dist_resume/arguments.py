"""Checks of the caller's arguments: a wrong type or value is one clear error naming it.

Bools are not integers here and nothing is converted (``"400"`` and ``400.0`` are refused,
not read as 400): a careless argument must fail, never silently mean something else.
"""

from __future__ import annotations

import operator
import os
import re

from dist_resume.storage import redact_url

# A scheme (two letters or more: "C:" is a drive) not followed by "//": a valid local path
# that a careless URL would silently turn into ("s3:/bucket/run" is ./s3:/bucket/run).
_MALFORMED_SCHEME = re.compile(r"([a-zA-Z][\w+.-]+):(/?)(?!/)(.*)", re.DOTALL)


def checked_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; TypeError for bools, floats, strings and other
    non-integers (numpy integers are integers), ValueError below ``minimum``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {number}")
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

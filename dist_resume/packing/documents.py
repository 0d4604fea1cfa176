"""A tokenized document as the packers read it: a 1-D array of integer token ids."""

from __future__ import annotations

from typing import Any

import numpy

TOKEN_LIMIT = 2**63  # token ids are int64 in every sequence


def past_int64(values: numpy.ndarray) -> int | None:
    """The largest of integer `values` if int64 cannot hold it (uint64 only), else None."""
    if values.dtype != numpy.uint64 or not values.size:
        return None
    largest = int(values.max())
    return largest if largest >= TOKEN_LIMIT else None


def document_tokens(document: Any, field: str | None, number: int) -> numpy.ndarray:
    """`document` (or its `field`) as a 1-D int64 array. A document that is not a 1-D
    sequence of integers (floats, bools, strings, nested lists, a mapping without `field`)
    or holds an id outside int64 is a `ValueError` naming it by `number` (its place in the
    shard, from 0) and saying what it is: never converted into other token ids."""
    if field is not None:
        try:
            document = document[field]
        except (KeyError, TypeError, IndexError):
            raise ValueError(f"document {number} has no field {field!r} (it is a {type(document).__name__})") from None
    try:
        tokens = numpy.asarray(document)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"document {number} is not a 1-D sequence of token ids ({exc})") from None
    if tokens.ndim != 1:
        raise ValueError(f"document {number} is not a 1-D sequence of token ids: it has shape {tokens.shape}")
    if tokens.dtype.kind not in "iu":
        if len(tokens) == 0:  # [] reads as float64: an empty document holds no token
            return numpy.empty(0, dtype=numpy.int64)
        raise ValueError(f"document {number} holds {tokens.dtype} values, not integer token ids")
    largest = past_int64(tokens)
    if largest is not None:
        raise ValueError(f"document {number} holds token id {largest}, past int64")
    return tokens.astype(numpy.int64, copy=False)

"""The one sequence length of a Mixture of packed sources, with which its weights count
tokens: every position is one sequence of at most `seq_len + 1` real tokens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dist_resume.packing import sequence_length


def agreed_seq_len(sources: Mapping[str, Any]) -> int | None:
    """The `seq_len` every source is packed to (None: no source is packed). Sources packed
    to different lengths, or packed next to sources that are not, are refused with one
    `ValueError` naming them: their weights would not count tokens."""
    lengths = {name: sequence_length(source) for name, source in sources.items()}
    packed = {name: seq_len for name, seq_len in lengths.items() if seq_len is not None}
    if not packed:
        return None
    described = ", ".join(f"source {name!r} has seq_len={seq_len}" for name, seq_len in packed.items())
    plain = [name for name, seq_len in lengths.items() if seq_len is None]
    if plain:
        raise ValueError(f"Mixture sources {', '.join(map(repr, packed))} are packed token sequences and "
                         f"{', '.join(map(repr, plain))} are not: a mixture of packed sources weighs tokens, so every "
                         "source must be packed (packed() for a stream of documents, TokenSequences for token files)")
    if len(set(packed.values())) > 1:
        raise ValueError(f"Mixture packed sources disagree on seq_len ({described}): its weights count tokens only if "
                         "every sequence holds the same seq_len + 1 of them; pack every source to one seq_len")
    return next(iter(packed.values()))

"""A mixture's definition as int64 values: saved in the loader state (G8: plain integers),
so a resume can check it (G6) and `dist-resume inspect` can count draws without the data."""

from __future__ import annotations

from dataclasses import dataclass

from dist_resume.mixtures.quotas import MAX_POSITION, MAX_TOTAL
from dist_resume.mixtures.schedule import Stage
from dist_resume.mixtures.source_orders import name_key
from dist_resume.randomness.seeds import derive_seed
from dist_resume.state.fields import ResumeStateError

_VERSION = 2  # 1: no seq_len nor token weighing (read as samples-weighed, seq_len unknown)
MAX_LENGTH = 2**62  # samples in one source: positions and draws stay int64


@dataclass(frozen=True)
class Definition:
    """Source names and lengths, the stages of weights (as integer quotas); the sources'
    `seq_len` if packed (0: not packed; None: a state of version 1 does not say); and, when
    the weights count tokens, each source's real tokens per source-epoch and a digest of
    where they lie (`tokens`, `tokens_digest`; None when the weights count samples)."""

    names: tuple[str, ...]
    lengths: tuple[int, ...]
    stages: tuple[Stage, ...]
    seq_len: int | None = 0
    tokens: tuple[int, ...] | None = None
    tokens_digest: int = 0

    def sources_digest(self) -> int:
        """Digest of what positions index: the sources' names and lengths (not the weights,
        which a reweighting resume may change)."""
        return derive_seed(len(self.names), *(name_key(name) for name in self.names), *self.lengths)

    def encode(self) -> list[int]:
        """`[version, S, lengths x S, name bytes count, UTF-8 bytes of the names joined by
        NUL, K, (start, quotas x S) x K, seq_len, weights count tokens (0/1), then if 1:
        tokens x S, tokens digest]`."""
        text = "\0".join(self.names).encode()
        values = [_VERSION, len(self.names), *self.lengths, len(text), *text, len(self.stages)]
        for stage in self.stages:
            values += [stage.start, *stage.quotas]
        values += [self.seq_len or 0, int(self.tokens is not None)]
        if self.tokens is not None:
            values += [*self.tokens, self.tokens_digest]
        return values

    @classmethod
    def decode(cls, values: list[int]) -> Definition:
        try:
            if values[0] not in (1, _VERSION):
                raise ResumeStateError(f"mixture definition has version {values[0]}; this dist_resume reads 1 and "
                                       f"{_VERSION}")
            count = values[1]
            lengths = tuple(values[2 : 2 + count])
            cursor = 2 + count
            text_length = values[cursor]
            names = tuple(bytes(values[cursor + 1 : cursor + 1 + text_length]).decode().split("\0"))
            cursor += 1 + text_length
            stages = []
            for _ in range(values[cursor]):
                start, quotas = values[cursor + 1], tuple(values[cursor + 2 : cursor + 2 + count])
                if len(quotas) != count:
                    raise IndexError
                stages.append(Stage(start, quotas))
                cursor += 1 + count
            seq_len, tokens, digest = None, None, 0
            if values[0] == _VERSION:
                seq_len, weighs_tokens = values[cursor + 1], values[cursor + 2]
                cursor += 2
                if weighs_tokens == 1:
                    tokens, digest = tuple(values[cursor + 1:cursor + 1 + count]), values[cursor + 1 + count]
                    cursor += count + 1
                elif weighs_tokens != 0:
                    raise ValueError
            starts = [stage.start for stage in stages]
            # every bound a Mixture itself keeps: a crafted value must not reach the arithmetic
            valid = (count > 0 and len(names) == count == len(lengths) and cursor + 1 == len(values)
                     and (seq_len is None or seq_len >= 0) and (tokens is None or len(tokens) == count
                                                                and min(tokens) > 0)
                     and starts[0] == 0 and all(a < b for a, b in zip(starts, starts[1:]))
                     and starts[-1] < MAX_POSITION and 0 < min(lengths) and max(lengths) < MAX_LENGTH
                     and all(min(s.quotas) >= 0 and 0 < sum(s.quotas) <= MAX_TOTAL for s in stages))
        except (IndexError, ValueError, OverflowError):
            valid = False
        if not valid:
            raise ResumeStateError("loader state's mixture definition is malformed")
        return cls(names, lengths, tuple(stages), seq_len, tokens, digest)

    def describe_sources(self) -> str:
        return ", ".join(f"{name!r} ({length} samples)" for name, length in zip(self.names, self.lengths))

    def describe_tokens(self) -> str:
        return ", ".join(f"{name!r} ({tokens} real tokens)" for name, tokens in zip(self.names, self.tokens or ()))

    def describe_weighing(self) -> str:
        return "count tokens" if self.tokens is not None else "count samples"

    def describe_stages(self) -> str:
        parts = []
        for stage in self.stages:
            weights = ", ".join(f"{name}: {quota}" for name, quota in zip(self.names, stage.quotas))
            parts.append(f"from {stage.start}: {{{weights}}}")
        return "; ".join(parts)

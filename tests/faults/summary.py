"""What a fault campaign counts, and the summary it prints."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Summary:
    """Counts of one campaign run. ``samples_lost``, ``samples_repeated`` and
    ``corrupted_accepted`` must stay 0: that is the claim the campaign checks."""

    trials: Counter[str] = field(default_factory=Counter)  # by campaign
    faults: Counter[str] = field(default_factory=Counter)  # injected, by kind
    checkpoints_verified: int = 0  # loaded and compared with what was saved
    errors_as_expected: int = 0  # a fault that had to fail did, with the expected error
    samples_lost: int = 0
    samples_repeated: int = 0
    corrupted_accepted: int = 0  # a damaged checkpoint loaded without an error

    def add_faults(self, prefix: str, counts: Counter[str]) -> None:
        self.faults.update({f"{prefix}.{kind}": count for kind, count in counts.items()})

    @property
    def clean(self) -> bool:
        return self.samples_lost == self.samples_repeated == self.corrupted_accepted == 0

    def format(self) -> str:
        lines = [f"trials: {sum(self.trials.values())} "
                 f"({', '.join(f'{k} {v}' for k, v in sorted(self.trials.items()))})",
                 f"faults injected: {sum(self.faults.values())}"]
        lines += [f"  {kind}: {count}" for kind, count in sorted(self.faults.items())]
        lines += [f"checkpoints verified: {self.checkpoints_verified}",
                  f"expected errors raised: {self.errors_as_expected}",
                  f"samples lost: {self.samples_lost}",
                  f"samples repeated: {self.samples_repeated}",
                  f"corrupted checkpoints accepted: {self.corrupted_accepted}"]
        return "\n".join(lines)

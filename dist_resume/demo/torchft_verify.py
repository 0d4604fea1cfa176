"""What the replica groups of a torchft run trained, from their records
(``dist_resume.demo.torchft_group``), counted against an epoch's order.

A sample is trained when it is in the batch of a group that took part in a step and committed
it. Per epoch: *lost* samples were never trained, *repeated* ones more than once (padding
excepted: the final step's wrap-around to the start of the epoch, G2), *wasted* batches were
fetched for a step that did not commit or that the group did not take part in. Under
``ManagedLoader`` the committed steps, in step order and each by participating rank, must also
read the epoch's order from its first position to its last (then the padding), and every
serving of a sample must carry the augmentation an uninterrupted run gives it (G4).
"""

from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dist_resume.demo.data import SyntheticDataset
from dist_resume.demo.records import EpochPositions, fingerprint
from dist_resume.loader.resumable import ResumableDataLoader


def read_lines(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete line of every group's records, in no particular order."""
    lines = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for text in path.read_text().splitlines():
            if text.endswith("}"):  # a line cut by a kill was never a committed step's
                lines.append(json.loads(text))
    return lines


def reference(dataset_size: int, seed: int, epochs: int) -> dict[tuple[int, int], str]:
    """(epoch, position) -> the augmented sample's fingerprint in an uninterrupted run."""
    loader = ResumableDataLoader(SyntheticDataset(dataset_size), batch_size=16, shuffle=True, seed=seed,
                                 rank=0, world_size=1)
    positions = EpochPositions(dataset_size, seed, True)
    found = {}
    while loader.epoch < epochs:
        epoch = loader.epoch
        for features, _, indices in loader:
            found.update({(epoch, p): fingerprint(f) for p, f in zip(positions(epoch, indices.tolist()), features)})
    return found


@dataclass
class EpochTally:
    """One epoch's count."""

    epoch: int
    trained: int = 0  # sample servings in committed steps that took part, padding included
    lost: list[int] = field(default_factory=list)  # positions never trained
    repeated: int = 0  # servings beyond the first, padding excepted
    padding: int = 0
    out_of_order: str = ""  # where the committed steps leave the epoch's order ("" if nowhere)


@dataclass
class Tally:
    """A run's count over its epochs."""

    epochs: list[EpochTally]
    wasted: int  # batches of steps not committed or not taken part in
    steps: int  # committed steps
    augmentation_mismatches: int  # servings whose augmentation differs from the uninterrupted run's

    @property
    def lost(self) -> int:
        return sum(len(epoch.lost) for epoch in self.epochs)

    @property
    def repeated(self) -> int:
        return sum(epoch.repeated for epoch in self.epochs)

    @property
    def exact(self) -> bool:
        """Every sample of every epoch trained exactly once, in the epoch's order, each with
        its own augmentation."""
        return (self.lost == 0 and self.repeated == 0 and self.augmentation_mismatches == 0
                and not any(epoch.out_of_order for epoch in self.epochs))


def tally(lines: list[dict[str, Any]], dataset_size: int, seed: int, epochs: int) -> Tally:
    """Count what the records of one run show (see the module docstring)."""
    steps = [line for line in lines if line.get("event") == "step"]
    trained = [line for line in steps if line["committed"] and line["taking_part"]]
    expected = reference(dataset_size, seed, epochs)
    mismatches = sum(expected.get((line["epoch"], p)) != f for line in steps
                     for p, f in zip(line["positions"], line["fingerprints"]))
    result = Tally([], sum(1 for line in steps if not (line["committed"] and line["taking_part"])),
                   len({line["step"] for line in trained}), mismatches)
    for epoch in range(epochs):
        mine = sorted((line for line in trained if line["epoch"] == epoch),
                      key=lambda line: (line["step"], line["rank"]))
        result.epochs.append(_epoch_tally(epoch, mine, dataset_size))
    return result


def _epoch_tally(epoch: int, lines: list[dict[str, Any]], dataset_size: int) -> EpochTally:
    tallied = EpochTally(epoch)
    stream = [position for line in lines for position in line["positions"]]
    tallied.trained = len(stream)
    counts = collections.Counter(stream)
    tallied.lost = [p for p in range(dataset_size) if p not in counts]
    beyond = stream[dataset_size:]
    if stream[:dataset_size] == list(range(dataset_size)) and beyond == list(range(len(beyond))):
        tallied.padding = len(beyond)  # the final step wrapped around to the epoch's start
    tallied.repeated = sum(count - 1 for count in counts.values()) - tallied.padding
    for line in lines:  # each committed step's parts: ranks 0..n-1, once each
        ranks = [other["rank"] for other in lines if other["step"] == line["step"]]
        if sorted(ranks) != list(range(line["participants"])):
            tallied.out_of_order = f"step {line['step']} has parts of ranks {sorted(ranks)} of {line['participants']}"
            return tallied
    first_wrong = next((i for i, p in enumerate(stream[:dataset_size]) if p != i), None)
    if first_wrong is not None:
        tallied.out_of_order = f"the committed steps' {first_wrong}-th sample is at position {stream[first_wrong]}"
    return tallied

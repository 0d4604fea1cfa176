"""The code blocks of README.md and docs/*.md, with the marker that says how each runs
(docs/testing.md, "The documentation's snippets")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*(not run|run with)\s*:(.*)-->")
TORCHRUN = re.compile(r"torchrun --nproc-per-node (\d+)")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    marker: tuple[str, str] | None  # ("not run" | "run with", what follows the colon), stripped

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def not_run(self) -> str | None:
        """The reason given for not running it, None when it runs."""
        return self.marker[1] if self.marker and self.marker[0] == "not run" else None

    @property
    def processes(self) -> int | None:
        """torchrun's --nproc-per-node for a block run with torchrun, None for `python snippet.py`."""
        if not (self.marker and self.marker[0] == "run with"):
            return None
        torchrun = TORCHRUN.fullmatch(self.marker[1])
        if torchrun is None:
            raise ValueError(f"{self.name}: `run with: {self.marker[1]}` is not `torchrun --nproc-per-node N`")
        return int(torchrun.group(1))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    found, lines = [], page.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        marker = MARKER.fullmatch(lines[index - 1].strip()) if index else None
        found.append(Block(page, index + 1, opening.group(1), "\n".join(lines[index + 1 : end]) + "\n",
                           (marker.group(1), marker.group(2).strip()) if marker else None))
        index = end + 1
    return found

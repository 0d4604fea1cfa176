"""A step's commit marker, read and checked field by field: damage is one
:class:`CheckpointCorruptError`."""

from __future__ import annotations

import json
import re
from typing import Any

from dist_resume.checkpoint.bounded_files import MissingFile, read_whole
from dist_resume.checkpoint.digests import checked_digests
from dist_resume.errors import CheckpointCorruptError
from dist_resume.state.fields import MAX_WORLD_SIZE
from dist_resume.storage import Location

ATTEMPT_PREFIX = "attempt_"
ATTEMPT_NAME = re.compile(rf"{ATTEMPT_PREFIX}[0-9a-f]{{32}}")  # one save's own directory inside its step
MARKER_LIMIT = 64 * 2**10  # a commit marker is a few hundred bytes of JSON
LATEST_TIME = 32503680000.0  # the year 3000: any later "commit time" is damage


def read_marker(loc: Location, path: str, step: int, where: str) -> dict[str, Any] | None:
    """The commit marker ``path`` of ``step``, each field checked (see :func:`parse_marker`);
    None if there is none."""
    try:
        data = read_whole(loc, path, where, MARKER_LIMIT)
    except MissingFile:
        return None
    return parse_marker(data, step, where)


def parse_marker(data: bytes, step: int, where: str) -> dict[str, Any]:
    """The fields of a commit marker, each checked: ``step``, ``world_size``, ``committed_at``."""
    try:
        marker = json.loads(data, parse_constant=lambda name: float("nan"))
    except ValueError as exc:
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker is not JSON ({exc})") from None
    if not isinstance(marker, dict):
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker is not a JSON object")
    for name in ("step", "world_size", "committed_at"):
        if name not in marker:
            raise CheckpointCorruptError(f"{where} is damaged: its commit marker has no {name!r}")
    world_size, committed_at = marker["world_size"], marker["committed_at"]
    if marker["step"] != step or type(marker["step"]) is not int:
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker names step {marker['step']!r}")
    if type(world_size) is not int or not 1 <= world_size <= MAX_WORLD_SIZE:
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker has world_size {world_size!r}")
    if type(committed_at) not in (int, float) or not 0 <= committed_at <= LATEST_TIME:
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker has committed_at {committed_at!r}")
    attempt = marker.get("attempt")  # absent in steps saved before attempts had directories
    if attempt is not None and not (isinstance(attempt, str) and ATTEMPT_NAME.fullmatch(attempt)):
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker names attempt {str(attempt)[:80]!r}")
    checked_digests(marker, where)
    return marker

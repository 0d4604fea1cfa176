"""The store class of each kind of location: one place that knows every backend, above them."""

from __future__ import annotations

from dist_resume.storage.local_store import LocalStore
from dist_resume.storage.location import Location
from dist_resume.storage.object_store import ObjectStore
from dist_resume.storage.store import CheckpointStore


def open_store(loc: Location) -> CheckpointStore:
    """The store of ``loc``'s backend."""
    return LocalStore(loc) if loc.is_local else ObjectStore(loc)

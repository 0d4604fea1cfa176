"""Checkpoint storage: locations and their secrets, retries, DCP's file adapter, and one
store class per backend (local disk, object stores through fsspec)."""

from dist_resume.storage.dcp_files import CheckpointWriter
from dist_resume.storage.location import Location, redact_url, resolve
from dist_resume.storage.retries import RETRY_ATTEMPTS, is_transient, retry
from dist_resume.storage.store import DIRECTORY, FILE, LINK, CheckpointStore, Entry, open_store

__all__ = ["DIRECTORY", "FILE", "LINK", "RETRY_ATTEMPTS", "CheckpointStore", "CheckpointWriter", "Entry",
           "Location", "is_transient", "open_store", "redact_url", "resolve", "retry"]

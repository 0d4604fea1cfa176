"""Checkpoint storage: locations and their secrets (G9), retries, DCP's file adapter, and
one store class per backend (local disk, object stores through fsspec), chosen by
`open_store` in `backends`. Knows nothing of checkpoints' layout or the data loader:
imports `errors` only. DCP's file adapter (`dcp_files.CheckpointWriter`) is imported from
its module, not here, so that reading shards of a stream does not import DCP."""

from dist_resume.storage.backends import open_store
from dist_resume.storage.local_store import private_write_target
from dist_resume.storage.location import Location, guarded, redact_url, resolve
from dist_resume.storage.retries import RETRY_ATTEMPTS, is_transient, retry
from dist_resume.storage.store import DIRECTORY, FILE, LINK, CheckpointStore, Entry

__all__ = ["DIRECTORY", "FILE", "LINK", "RETRY_ATTEMPTS", "CheckpointStore", "Entry",
           "Location", "guarded", "is_transient", "open_store", "private_write_target", "redact_url", "resolve",
           "retry"]

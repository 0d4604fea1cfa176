"""Storage behaviour without S3 (G9): any fsspec protocol, retries, redaction."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import traceback
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
import torch
from botocore.exceptions import ClientError
from fsspec.implementations.memory import MemoryFileSystem

from dist_resume import storage
from dist_resume.checkpoint.load import list_checkpoints, load_checkpoint
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.errors import CheckpointError
from dist_resume.storage import is_transient, redact_url, resolve, retries

SLOW_DOWN = "SlowDown: please reduce your request rate"


class FlakyFileSystem(MemoryFileSystem):
    """In-memory files; the next ``failures`` shard uploads raise ``error``."""

    protocol = "flaky"
    store: dict = {}
    pseudo_dirs = [""]
    failures = 0
    error: OSError = OSError(errno.EBUSY, SLOW_DOWN)
    uploads = 0

    def _open(self, path: str, mode: str = "rb", **kwargs):
        if "w" in mode and path.endswith(".distcp"):
            type(self).uploads += 1
            if type(self).failures:
                type(self).failures -= 1
                raise type(self).error
        return super()._open(path, mode, **kwargs)


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FlakyFileSystem]]:
    fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)
    monkeypatch.setattr(retries, "RETRY_BASE_DELAY", 0.0)
    FlakyFileSystem.store.clear()
    FlakyFileSystem.uploads = 0
    yield FlakyFileSystem
    FlakyFileSystem.failures = 0
    FlakyFileSystem.error = OSError(errno.EBUSY, SLOW_DOWN)


def test_transient_errors_are_retried(flaky: type[FlakyFileSystem]) -> None:
    flaky.failures = 2
    save_checkpoint({"w": torch.ones(5)}, "flaky://run", 1)
    assert flaky.uploads == 3
    state = {"w": torch.zeros(5)}
    assert load_checkpoint(state, "flaky://run") == 1 and torch.equal(state["w"], torch.ones(5))


def test_save_failing_after_retries_raises_and_commits_nothing(flaky: type[FlakyFileSystem]) -> None:
    flaky.failures = 100
    message = f"saving step 1 at flaky://run failed on rank(s) [0]: OSError: [Errno {errno.EBUSY}] {SLOW_DOWN}"
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        save_checkpoint({"w": torch.ones(5)}, "flaky://run", 1)
    assert flaky.uploads == storage.RETRY_ATTEMPTS
    assert not any(path.endswith(".committed") for path in flaky.store)
    assert list_checkpoints("flaky://run") == []
    assert load_checkpoint({"w": torch.zeros(5)}, "flaky://run") is None


def test_permanent_errors_are_not_retried(flaky: type[FlakyFileSystem]) -> None:
    flaky.failures, flaky.error = 1, PermissionError("Access Denied")
    with pytest.raises(CheckpointError, match=re.escape("PermissionError: Access Denied")):
        save_checkpoint({"w": torch.ones(5)}, "flaky://run", 1)
    assert flaky.uploads == 1


def test_async_save_failure_reaches_handle_and_next_save(flaky: type[FlakyFileSystem]) -> None:
    flaky.failures = 100
    handle = save_checkpoint({"w": torch.ones(5)}, "flaky://run", 1, async_save=True)
    with pytest.raises(CheckpointError, match=r"^saving step 1 at flaky://run failed"):
        handle.result()
    assert list_checkpoints("flaky://run") == []
    flaky.failures = 0
    # the failure was observed through the handle: the next save proceeds
    save_checkpoint({"w": torch.ones(5)}, "flaky://run", 2)
    assert [i.step for i in list_checkpoints("flaky://run")] == [2]


def test_unobserved_async_failure_is_reported_by_next_save(flaky: type[FlakyFileSystem]) -> None:
    flaky.failures = 100
    save_checkpoint({"w": torch.ones(5)}, "flaky://run", 1, async_save=True)
    with pytest.raises(CheckpointError, match=r"^the asynchronous save of step 1 failed: saving step 1"):
        save_checkpoint({"w": torch.ones(5)}, "flaky://run", 2)


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_transient_classification() -> None:
    assert is_transient(OSError(errno.EBUSY, SLOW_DOWN))
    assert is_transient(ConnectionResetError(errno.ECONNRESET, "reset"))
    assert is_transient(_client_error("InternalError", 500))
    assert is_transient(_client_error("SlowDown", 503))
    wrapped = OSError(errno.EIO, "wrapped")
    wrapped.__cause__ = _client_error("ServiceUnavailable", 503)
    assert is_transient(wrapped)
    assert not is_transient(PermissionError("Access Denied"))
    assert not is_transient(FileNotFoundError("nope"))
    assert not is_transient(_client_error("AccessDenied", 403))


def test_urls_and_messages_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    assert redact_url("ftp://user:hunter2@host/ckpt?token=abc#x") == "ftp://host/ckpt?token=***#x"
    assert redact_url("/local/path") == "/local/path"
    assert redact_url("s3://bucket/run") == "s3://bucket/run"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-value")
    loc = resolve("memory://run", {"client_kwargs": {"aws_session_token": "nested-token"}, "password": "pw-value"})
    text = "failed env-secret-value nested-token pw-value at sftp://me:pw2@host/x"
    assert loc.redact(text) == "failed *** *** *** at sftp://***@host/x"
    error = loc.error("read", loc.join("a"), OSError(errno.EIO, "boom pw-value"))
    assert str(error) == "cannot read memory://run/a: storage error (OSError: [Errno 5] boom ***)"


@pytest.mark.parametrize("call", ["resolve", "save_checkpoint", "load_checkpoint", "list_checkpoints"])
def test_secrets_stay_out_of_tracebacks_that_capture_locals(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """G9: error reports that print every frame's locals (pytest --showlocals, rich, Sentry)
    show no secret from the environment, nor the values of secret options in our frames."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-value")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-session-token")
    options = {"client_kwargs": {"aws_session_token": "nested-token"}, "password": "pw-value"}
    calls = {
        "resolve": lambda: resolve("nosuchproto://x", options),
        "save_checkpoint": lambda: save_checkpoint({"w": torch.ones(1)}, "nosuchproto://x", 1, storage_options=options),
        "load_checkpoint": lambda: load_checkpoint({}, "nosuchproto://x", storage_options=options),
        "list_checkpoints": lambda: list_checkpoints("nosuchproto://x", options),
    }
    with pytest.raises(CheckpointError) as caught:
        calls[call]()
    frames = traceback.TracebackException.from_exception(caught.value, capture_locals=True).stack
    ours = [frame for frame in frames if "/dist_resume/" in frame.filename]
    assert ours, "the error was raised outside dist_resume"
    shown = "\n".join(f"{name}={value}" for frame in ours for name, value in (frame.locals or {}).items())
    for secret in ("env-secret-value", "env-session-token", "nested-token", "pw-value"):
        assert secret not in shown


def test_bad_url_is_a_clear_error() -> None:
    with pytest.raises(CheckpointError, match=r"^cannot open storage for nosuchproto://x: "):
        load_checkpoint({}, "nosuchproto://x")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs mounted for the test: a disk that fills up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a tmpfs mount, which needs root")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                            capture_output=True, text=True)
    if result.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_says_so_and_keeps_the_last_step(small_disk: Path) -> None:
    """torch's archive writer reports a failed write as 'unexpected pos': the error names
    ENOSPC instead, and the last committed step stays the latest (G7)."""
    run = str(small_disk / "run")
    save_checkpoint({"w": torch.ones(10)}, run, 1)
    message = f"saving step 2 at {run} failed on rank(s) [0]: OSError: [Errno 28] No space left on device"
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        save_checkpoint({"w": torch.zeros(200_000)}, run, 2)
    assert [info.step for info in list_checkpoints(run)] == [1]
    state = {"w": torch.zeros(10)}
    assert load_checkpoint(state, run) == 1 and torch.equal(state["w"], torch.ones(10))


@pytest.mark.parametrize(("url", "printed"), [
    ("s3://b/hash#frag/run", "s3://b/hash#frag/run"),
    ("s3://b/q?x=1/run", "s3://b/q?x=1/run"),
    ("s3://b/q?sig=abc&x=1", "s3://b/q?sig=***&x=1"),
    ("file:///tmp/a#b/run", "file:///tmp/a#b/run"),
    ("/tmp/a#b/run", "/tmp/a#b/run"),
    ("s3://b/new\nline/run", "s3://b/new\\nline/run"),
    ("s3://b/tab\there", "s3://b/tab\\there"),
    ("/tmp/new\nline", "/tmp/new\\nline"),
])
def test_a_url_is_printed_as_the_place_it_names(url: str, printed: str) -> None:
    """fsspec reads '#', '?', newlines and tabs as part of the path: the printed URL keeps
    them (control characters escaped, so one URL prints on one line), and only credentials
    and secret query values are masked."""
    loc = resolve(url)
    assert loc.url == printed
    assert loc.url_of(loc.join("step_00000001")) == printed + "/step_00000001"


def test_a_run_under_a_url_with_a_fragment_lists_its_own_place(tmp_path: Path) -> None:
    run = f"file://{tmp_path}/hash#frag/run"
    save_checkpoint({"w": torch.ones(1)}, run, 1)
    assert (tmp_path / "hash#frag" / "run" / "step_00000001" / ".committed").is_file()
    assert [info.url for info in list_checkpoints(run)] == [f"{run}/step_00000001"]
    message = (f"step 1 is already committed at {run} by this job (an earlier save of step 1 committed it, even if "
               "that save raised); a committed checkpoint is never overwritten: give each save a new step")
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        save_checkpoint({"w": torch.ones(1)}, run, 1)


def test_a_file_removed_while_its_folder_is_listed_leaves_the_rest_listed(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer's private file renamed away between the listing's read and its stat (a lease
    heartbeat beside a load): the run's steps are still listed. It once emptied the listing,
    and list_checkpoints found no step."""
    run = tmp_path / "run"
    save_checkpoint({"w": torch.ones(2)}, str(run), 1)
    (run / ".writer_lease_0.0123456789abcdef0123456789abcdef.tmp").write_text("")
    real_scandir = os.scandir

    class Removing:
        """os.scandir, except that the private file is removed right after it was read."""

        def __init__(self, path: str) -> None:
            self.found = real_scandir(path)

        def __enter__(self) -> Iterator[os.DirEntry]:
            for entry in self.found.__enter__():
                if entry.name.endswith(".tmp"):
                    os.remove(entry.path)
                yield entry

        def __exit__(self, *exc: object) -> None:
            self.found.__exit__(*exc)

    monkeypatch.setattr(storage.local_store.os, "scandir", Removing)
    assert [info.step for info in list_checkpoints(str(run))] == [1]

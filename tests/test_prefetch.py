"""Shards opened ahead (issue 21 point 5): while a reader reads shard n, shard n+1 is already
opened (seen through a file system that records its opens, not through timing); a shard
that cannot be opened fails the stream when that shard is reached, naming its URL and the
cause, without secrets."""

from __future__ import annotations

import multiprocessing
import re
import threading
import time
from collections.abc import Iterator

import pytest
from fsspec import register_implementation
from fsspec.implementations.local import LocalFileSystem

from dist_resume import StorageError
from dist_resume.streams import ShardedStream
from dist_resume.streams.formats import JsonlReader
from dist_resume.streams.prefetch import ShardFiles

from .format_files import jsonl_bytes, write
from .s3_server import FAKE_SECRET, s3_bucket, s3_endpoint  # noqa: F401
from .test_storage_s3 import s3_auth  # noqa: F401

WAIT = 60  # seconds a check waits for a background open before it fails (never reached when it works)


class RecordingFileSystem(LocalFileSystem):
    """Local files under ``recording://``, recording each open (path and file), with an event
    per opened path."""

    protocol = "recording"
    events: list[tuple[str, str]] = []
    opened: dict[str, threading.Event] = {}
    lock = threading.Lock()

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("recording://"))

    def _open(self, path, mode="rb", **kwargs):
        file = super()._open(path, mode, **kwargs)
        with self.lock:
            self.events.append((path, file))
        self._event(self.opened, path).set()
        return file

    @classmethod
    def _event(cls, events: dict[str, threading.Event], path: str) -> threading.Event:
        with cls.lock:
            return events.setdefault(path, threading.Event())

    @classmethod
    def opens(cls) -> list[str]:
        return [path for path, _ in cls.events]

    @classmethod
    def all_closed(cls) -> bool:
        return all(file.closed for _, file in cls.events)

    @classmethod
    def reset(cls) -> None:
        cls.events.clear()
        cls.opened.clear()

    @classmethod
    def wait_opened(cls, path: str) -> bool:
        return cls._event(cls.opened, path).wait(WAIT)

    @classmethod
    def wait_closed(cls, path: str) -> bool:
        """Whether `path`'s files were all closed within WAIT seconds (a file opened ahead
        is closed when its open ends, in the opening thread; a file has no close hook:
        fsspec's local files close from their context manager, bypassing close())."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            with cls.lock:
                if all(file.closed for opened, file in cls.events if opened == path):
                    return True
            time.sleep(0.01)
        return False


register_implementation("recording", RecordingFileSystem, clobber=True)


SIZES = [3, 0, 2, 4]


@pytest.fixture
def shards(tmp_path) -> list[str]:
    sizes = SIZES
    urls = [write(f"recording://{tmp_path}/s{n}.jsonl", jsonl_bytes([f"{n}-{i}" for i in range(size)]))
            for n, size in enumerate(sizes)]
    RecordingFileSystem.reset()
    return urls


def path_of(url: str) -> str:
    return url.removeprefix("recording://")


class NextOpenedCheck:
    """A JSONL reader that, before a shard's last item, records whether the shard after it
    has been opened (waiting for that open, at most WAIT seconds)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.seen: list[tuple[str, bool]] = []

    def __call__(self, file) -> Iterator[str]:
        items = list(JsonlReader()(file))
        position = self.urls.index(f"recording://{file.path}")
        if position + 1 < len(self.urls):
            self.seen.append((file.path, RecordingFileSystem.wait_opened(path_of(self.urls[position + 1]))))
        yield from items


def test_the_next_shard_is_opened_while_the_current_one_is_read(shards):
    check = NextOpenedCheck(shards)
    stream = ShardedStream(shards, check, shuffle=False, lengths=SIZES)  # given lengths: no counting pass
    assert list(stream) == ["0-0", "0-1", "0-2", "2-0", "2-1", "3-0", "3-1", "3-2", "3-3"]
    assert check.seen == [(path_of(url), True) for url in shards[:-1]]
    assert RecordingFileSystem.opens() == [path_of(url) for url in shards]  # each shard once, in order
    assert RecordingFileSystem.all_closed()


def test_a_canonical_stream_prefetches_only_its_own_shards(shards):
    """Of 3 canonical streams over 9 items, stream 1 reads items 3-5: shard 2 and the first
    item of shard 3; it opens only those."""
    stream = ShardedStream(shards, JsonlReader(), shuffle=False, lengths=SIZES)
    assert list(stream.canonical_reader(0, 1, 3).all()) == ["2-0", "2-1", "3-0"]
    assert RecordingFileSystem.opens() == [path_of(shards[2]), path_of(shards[3])]
    assert RecordingFileSystem.all_closed()


def test_a_stream_stopped_early_closes_the_shard_opened_ahead(shards):
    items = iter(ShardedStream(shards, JsonlReader(), shuffle=False, lengths=SIZES))
    assert next(items) == "0-0"
    assert RecordingFileSystem.wait_opened(path_of(shards[1]))
    items.close()
    assert RecordingFileSystem.wait_closed(path_of(shards[1]))
    assert RecordingFileSystem.opens() == [path_of(url) for url in shards[:2]]
    assert RecordingFileSystem.all_closed()


def test_each_shard_url_is_resolved_once(shards, monkeypatch):
    """Resolving a URL costs ~100 us (per shard, ~1% of a local JSONL shard's reading)."""
    from dist_resume.streams import prefetch, shard_files

    resolved = []
    for module in (prefetch, shard_files):
        monkeypatch.setattr(module, "resolve",
                            lambda url, options, real=module.resolve: resolved.append(url) or real(url, options))
    assert len(list(ShardedStream(shards, JsonlReader(), shuffle=False, lengths=SIZES))) == sum(SIZES)
    assert sorted(resolved) == sorted(shards)


def test_shards_are_opened_in_the_announced_order_only(shards):
    with ShardFiles(shards[:2]) as files:
        message = f"shard {shards[1]} opened out of the announced order (next announced: {shards[0]})"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            files.open(shards[1])
        files.open(shards[0]).close()
        files.open(shards[1]).close()
        with pytest.raises(ValueError, match=re.escape("opened out of the announced order (next announced: no further shard)")):
            files.open(shards[1])
    with pytest.raises(ValueError, match="^ShardFiles is closed$"):
        files.open(shards[0])


def test_a_missing_shard_fails_when_it_is_reached_with_its_url(tmp_path):
    urls = [write(f"{tmp_path}/{name}.jsonl", jsonl_bytes([name])) for name in ("a", "c")]
    missing = f"{tmp_path}/b.jsonl"
    items = iter(ShardedStream([urls[0], missing, urls[1]], JsonlReader(), shuffle=False, lengths=[1, 1, 1]))
    assert next(items) == "a"  # shard b was opened ahead, and failed, while a was read
    message = f"cannot read shard {missing}: not found (FileNotFoundError: "
    with pytest.raises(StorageError, match=f"^{re.escape(message)}") as caught:
        next(items)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_s3_shard_with_bad_credentials_is_named_without_the_secret(s3_bucket, request):  # noqa: F811
    url = write(f"{s3_bucket}/a.jsonl", jsonl_bytes([1]))
    request.getfixturevalue("s3_auth")  # moto checks credentials from here on
    options = {"key": "wrong-key-id", "secret": FAKE_SECRET}
    message = f"cannot read shard {url}: access denied, check the credentials (PermissionError: Forbidden)"
    with pytest.raises(StorageError, match=f"^{re.escape(message)}$") as caught:
        list(ShardedStream([url], JsonlReader(), storage_options=options, lengths=[1]))
    assert FAKE_SECRET not in str(caught.value) and FAKE_SECRET not in repr(caught.value)


def _open_next_in_child(files: ShardFiles, url: str, results) -> None:
    with files.open(url) as file:
        results.put(list(JsonlReader()(file)))


def test_a_forked_copy_opens_its_shards_itself(shards):
    """A loader worker forked while its stream had a shard opened ahead: the parent's
    opening thread does not exist in the child, which must not wait for it forever."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    with ShardFiles([shards[0], shards[2]]) as files:
        files.open(shards[0]).close()  # shards[2] is now opening ahead, in this process
        child = context.Process(target=_open_next_in_child, args=(files, shards[2], results))
        child.start()
        child.join(WAIT)
        assert child.exitcode == 0
        assert results.get(timeout=WAIT) == ["2-0", "2-1"]
        with files.open(shards[2]) as file:  # the parent's own, untouched by the child
            assert list(JsonlReader()(file)) == ["2-0", "2-1"]


def test_a_shard_shorter_than_the_head_is_read_from_memory_alone(tmp_path):
    data = jsonl_bytes([f"line {i}" for i in range(5)])
    url = write(f"recording://{tmp_path}/short.jsonl", data)
    RecordingFileSystem.reset()
    with ShardFiles([url], head_bytes=len(data) + 1) as files, files.open(url) as file:
        assert RecordingFileSystem.wait_opened(path_of(url)) and RecordingFileSystem.all_closed()
        assert file.path == path_of(url) and file.fs.protocol == "recording"  # named as fsspec's files are
        assert list(JsonlReader()(file)) == [f"line {i}" for i in range(5)]
        assert file.seek(-3, 2) == len(data) - 3 and file.read() == data[-3:]
    assert RecordingFileSystem.opens() == [path_of(url)]  # its one read


def test_a_shard_longer_than_the_head_reads_on_from_its_file(tmp_path):
    """Its first bytes come from memory, the rest from its file (opened ahead too), across
    the boundary for any read, seek and line."""
    data = b"".join(b"%d\n" % i for i in range(40))  # 110 bytes
    url = write(f"recording://{tmp_path}/long.txt", data)
    RecordingFileSystem.reset()
    with ShardFiles([url], head_bytes=17) as files, files.open(url) as file:  # the head ends inside b"8\n"
        assert file.read(10) == data[:10] and file.read(10) == data[10:20]
        assert file.seek(0) == 0 and file.read() == data
        assert file.seek(14) == 14 and file.readline() == b"7\n" and file.readline() == b"8\n"
        assert file.tell() == 18
        assert file.seek(-5, 2) == len(data) - 5 and file.read() == data[-5:]
        assert file.seek(3) == 3 and file.seek(4, 1) == 7 and file.read(12) == data[7:19]
        assert file.seek(0) == 0 and list(file) == data.splitlines(keepends=True)
        assert file.seekable() and file.readable()
    assert RecordingFileSystem.opens() == [path_of(url), path_of(url)]  # the head's read, then the file
    assert RecordingFileSystem.all_closed()


class GatedFileSystem(RecordingFileSystem):
    """`recording://` files, except that opening or reading a path in `gated` waits until
    `gate` is set (an object store that has not answered yet)."""

    protocol = "gated"
    gated: set[str] = set()
    gate = threading.Event()

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("gated://"))

    def _open(self, path, mode="rb", **kwargs):
        if path in self.gated:
            self.gate.wait(WAIT)
        return super()._open(path, mode, **kwargs)


register_implementation("gated", GatedFileSystem, clobber=True)


def test_closing_never_waits_for_the_open_ahead(tmp_path):
    """close() while the next shard's open has not answered returns at once (it may run
    in a generator's finalizer on any thread, the object store's event loop among them:
    waiting there for an open that needs that loop hung the process), and the file that
    open returns later is closed."""
    urls = [write(f"gated://{tmp_path}/s{n}.jsonl", jsonl_bytes([f"{n}-{i}" for i in range(3)])) for n in range(2)]
    RecordingFileSystem.reset()
    GatedFileSystem.gated = {f"{tmp_path}/s1.jsonl"}
    GatedFileSystem.gate = threading.Event()
    files = ShardFiles(urls, head_bytes=0)
    with files.open(urls[0]) as file:
        assert list(JsonlReader()(file)) == ["0-0", "0-1", "0-2"]
    closer = threading.Thread(target=files.close)
    closer.start()
    closer.join(WAIT)
    returned = not closer.is_alive()
    GatedFileSystem.gate.set()  # the store answers
    closer.join()
    assert returned, "close() waited for the open ahead"
    assert RecordingFileSystem.wait_opened(f"{tmp_path}/s1.jsonl")
    assert RecordingFileSystem.wait_closed(f"{tmp_path}/s1.jsonl"), "the file opened ahead was left open"
    assert RecordingFileSystem.opens() == [f"{tmp_path}/s0.jsonl", f"{tmp_path}/s1.jsonl"]
    assert RecordingFileSystem.all_closed()

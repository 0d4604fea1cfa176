"""The tar reader of `WebDatasetReader` (issue 35 point 2, issue 33's sparse member): the
512-byte headers parsed directly yield what Python's tarfile yields for any tar it or
WebDataset's TarWriter writes; damage, members it does not read and sizes a header only
claims are one `ValueError` naming the shard and the member, in bounded memory."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
import tarfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from dist_resume import WebDatasetReader
from dist_resume.streams.formats.tar_members import tar_members
from dist_resume.streams.formats.tar_stream import tar_stream

from .format_files import CountingFile, tar_bytes
from .hostile_files import outcome
from .tar_crafting import (
    BLOCK, END, base256, claimed, gnu_sparse, header, padded, pax_block, pax_sparse, tarfile_members, tarfile_samples,
    tarfile_samples_completed, webdataset_tar, with_checksum)

SHARD = "mem://shard"
GIB8 = 2**33


class Pipe(io.RawIOBase):
    """A shard that cannot seek and hands out at most 300 bytes a read, as a pipe may."""

    name = "mem://pipe"

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self.inner.readinto(memoryview(buffer)[:300])


def members(data: bytes, read_bytes: int, file: Callable[[bytes], io.IOBase] = CountingFile, with_data: bool = True):
    shard = file(data)
    return list(tar_members(tar_stream(shard, shard.name, read_bytes), shard.name, with_data))


def samples(data: bytes) -> list[dict]:
    return list(WebDatasetReader()(CountingFile(data)))


def count(data: bytes) -> int:
    return WebDatasetReader().count(CountingFile(data))


def error_of(call: Callable[[], object]) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    return str(caught.value)


# Random tars written by tarfile, in each of its formats

SEGMENT = st.text("abcxyz-_é0", min_size=1, max_size=40)
DATA = st.binary(max_size=1500) | st.integers(0, 3000).map(lambda size: bytes(range(256)) * (size // 256) + bytes(size % 256))


@st.composite
def tar_entries(draw) -> list[dict]:
    """Members of random samples (key.ext files, directories deep or long enough to need a
    GNU long name, a pax path or a ustar prefix), with directories, links and FIFOs between."""
    entries = []
    for key in range(draw(st.integers(0, 5))):
        directory = "/".join(draw(st.lists(SEGMENT, max_size=4)))
        stem = f"{directory}/{key}" if directory else str(key)
        for extension in draw(st.lists(st.sampled_from(["jpg", "json", "seg.png", "é.txt"]), min_size=1, max_size=3,
                                       unique=True)):
            entries.append({"name": f"{stem}.{extension}", "data": draw(DATA), "mtime": draw(st.sampled_from([0, 1.5])),
                            "pax": draw(st.dictionaries(st.sampled_from(["comment", "SCHILY.xattr.user.tag"]),
                                                        st.text(max_size=30), max_size=2))})
        if draw(st.booleans()):
            kind = draw(st.sampled_from([tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE]))
            entries.append({"name": f"{stem}-{kind.decode()}", "type": kind, "link": draw(SEGMENT) * draw(st.integers(1, 5))})
    return entries


def written(entries: list[dict], form: int, comment: str | None) -> bytes:
    sink = io.BytesIO()
    options = {"pax_headers": {"comment": comment}} if comment is not None else {}
    with tarfile.open(fileobj=sink, mode="w", format=form, **options) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry["name"])
            if "type" in entry:
                info.type, info.linkname = entry["type"], entry["link"]
                tar.addfile(info)
                continue
            info.size, info.mtime = len(entry["data"]), entry["mtime"]
            if form == tarfile.PAX_FORMAT:
                info.pax_headers = entry["pax"]
            tar.addfile(info, io.BytesIO(entry["data"]))
    return sink.getvalue()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tar_entries(), st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
       st.none() | st.text(max_size=20), st.integers(64, 5000))
def test_members_are_tarfiles_for_any_tar_tarfile_writes(entries, form, comment, read_bytes):
    """Names and data of the regular files, in order, as tarfile reads them, whatever the
    format, the extended headers and how the reads cut the stream (read_bytes); counting
    names the same members; samples group as the tarfile-based reader grouped them."""
    try:
        data = written(entries, form, comment if form == tarfile.PAX_FORMAT else None)
    except ValueError:  # a name or link too long for ustar
        assume(False)
    try:
        expected = tarfile_members(data)
    except tarfile.ReadError:  # a global header and nothing after it: tarfile refuses it, so does the reader
        assert error_of(lambda: members(data, read_bytes)).startswith(f"{SHARD}: the shard ends inside")
        return
    assert members(data, read_bytes) == expected
    assert members(data, read_bytes, Pipe) == expected
    assert members(data, read_bytes, with_data=False) == [(name, None) for name, _ in expected]
    assert samples(data) == tarfile_samples(data)
    assert count(data) == len(tarfile_samples(data))


SAMPLE_KEYS = st.lists(st.tuples(st.lists(SEGMENT, max_size=3), st.integers(0, 10**6)), max_size=6, unique_by=lambda k: k[1])


@settings(max_examples=100, deadline=None)
@given(SAMPLE_KEYS, st.data())
def test_samples_are_what_webdataset_wrote(keys, draw):
    """A tar of WebDataset's TarWriter (a pax header before every file) reads back as the
    samples written, and as tarfile reads it."""
    written_samples = []
    for directories, key in keys:
        sample = {"__key__": "/".join([*directories, f"{key:08}"])}
        for extension in draw.draw(st.lists(st.sampled_from(["bin", "id", "json", "seg.png"]), min_size=1, unique=True)):
            sample[extension] = draw.draw(DATA)
        written_samples.append(sample)
    data = webdataset_tar(written_samples)
    assert samples(data) == tarfile_samples(data) == written_samples
    assert count(data) == len(written_samples)


# Damage: one clear error, or the right samples

WDS = webdataset_tar([{"__key__": f"{'d' * 120}/{key:04}", "id": key.to_bytes(8, "little"), "bin": bytes([key]) * 700}
                      for key in range(3)])  # long keys: each name in a pax path record
GNU = written([{"name": f"{'g' * 150}/{key}.{extension}", "data": bytes([key]) * 600, "mtime": 0, "pax": {}}
               for key in range(2) for extension in ("a", "b")], tarfile.GNU_FORMAT, None)  # GNU long names
USTAR = written([{"name": f"{'u' * 120}/{key}.{extension}", "data": bytes([key]) * 100, "mtime": 0, "pax": {}}
                 for key in range(2) for extension in ("a", "b")], tarfile.USTAR_FORMAT, None)  # ustar prefixes
SHARDS = {"webdataset": WDS, "gnu": GNU, "ustar": USTAR}


def layout(data: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """(header start, data start, data size) of each member, and where the end blocks start."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        spans = [(member.offset, member.offset_data, member.size if member.isfile() else 0) for member in tar]
    last = spans[-1]
    return spans, last[1] + last[2] + (-last[2] % BLOCK)


def read_fully(data: bytes) -> tuple[list[dict], str | None, int]:
    """The samples read before any error, the error, and the peak memory of the reading."""
    got = []
    tracemalloc.start()
    try:
        for sample in WebDatasetReader()(CountingFile(data)):
            got.append(sample)
    except ValueError as error:
        return got, str(error), tracemalloc.get_traced_memory()[1]
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return got, None, peak


def changed_byte(original: bytes, needle: bytes, replacement: bytes) -> tuple[int, int]:
    """(position, what is added to its value, modulo 256) of the one byte that turns the
    first `needle` of `original` into `replacement`."""
    offset = next(index for index, (one, two) in enumerate(zip(needle, replacement)) if one != two)
    return original.index(needle) + offset, (replacement[offset] - needle[offset]) % 256


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(SHARDS)), st.integers(0, 2**20), st.integers(1, 255))
# A name record (no checksum covers it) made to name the next sample: the samples before the
# error are what the changed names say, not the original's.
@example("webdataset", *changed_byte(WDS, b"0000.id", b"0001.id"))
@example("gnu", *changed_byte(GNU, b"/0.b", b"/1.b"))
def test_any_byte_changed_gives_the_right_samples_or_one_error(shard, position, change):
    """A changed byte of member data changes that member's data and nothing else (tar has no
    checksum over data); one in padding or after the end block changes nothing; one in a
    header or the end block is a ValueError naming the shard, or changes nothing, or (in a
    pax or long-name record, which no checksum covers) reads as tarfile reads it, every
    member kept. No sample before an error differs from what tarfile reads of the changed
    shard up to where it stops, and memory stays bounded."""
    original = SHARDS[shard]
    position %= len(original)
    data = original[:position] + bytes([(original[position] + change) % 256]) + original[position + 1:]
    spans, end = layout(original)
    expected = tarfile_samples(original)
    got, error, peak = read_fully(data)
    assert peak < 2 * len(data) + 2**20
    in_data = [span for span in spans if span[1] <= position < span[1] + span[2]]
    in_records = any(span[0] <= position < span[1] - BLOCK for span in spans)  # extended headers' blocks and data
    if in_data:
        assert error is None
        assert got == tarfile_samples(data)  # the same members, one byte of one changed
        assert sum(a != b for one, two in zip(got, expected) for a, b in zip(one.values(), two.values())) == 1
    elif position >= end + BLOCK or any(span[1] + span[2] <= position < span[1] + span[2] + (-span[2] % BLOCK)
                                        for span in spans):
        assert (got, error) == (expected, None)
    elif error is not None:
        assert error.startswith(f"{SHARD}: ")
        assert got == tarfile_samples_completed(data)[:len(got)]  # what the shard says up to its damage
        if not in_records:  # a header block changed: its checksum stops the reading before it
            assert got == expected[:len(got)]
        assert error_of(lambda: count(data)) == error
    else:
        assert position < end and len(tarfile_members(data)) == len(tarfile_members(original))
        assert got == tarfile_samples(data)
    if error is None:
        assert count(data) == len(got)


@pytest.mark.parametrize("shard", sorted(SHARDS))
def test_a_shard_cut_anywhere_before_its_end_block_is_an_error(shard):
    original = SHARDS[shard]
    spans, end = layout(original)
    for cut in range(0, end + 1, 97):
        data = original[:cut]
        got, error, _ = read_fully(data)
        assert error is not None and error.startswith(f"{SHARD}: "), cut
        assert re.search("truncated|empty", error), error
        assert got == tarfile_samples(original)[:len(got)]
        assert error_of(lambda: count(data)) == error
        assert error_of(lambda: WebDatasetReader().count(Pipe(data))) == error.replace(SHARD, Pipe.name)
    assert read_fully(original[:end + BLOCK])[:2] == (tarfile_samples(original), None)


# Hostile members (issue 33): a size is a claim, read in bounded steps up to what is stored

SPARSE = "is a GNU sparse file, which this reader does not read (its holes would have to be made up)"
HOSTILE = {
    "GNU sparse member": (lambda declared: gnu_sparse("big.bin", declared, b"x" * 512),
                          lambda declared: f"tar member 'big.bin' (at byte 0) {SPARSE}"),
    "pax sparse member": (lambda declared: pax_sparse("big.bin", declared, b"x" * 512),
                          lambda declared: f"tar member 'big.bin' (at byte 0) {SPARSE}"),
    "claimed size": (lambda declared: claimed("big.bin", declared, b"x" * 512),
                     lambda declared: f"tar member 'big.bin' declares {declared:,} bytes, but the shard ends after 512 "
                                      "of them: it is truncated"),
    "claimed pax size": (lambda declared: pax_block({"size": str(declared)}) + claimed("big.bin", 512, b"x" * 512),
                         lambda declared: f"tar member 'big.bin' declares {declared:,} bytes, but the shard ends after "
                                          "512 of them: it is truncated"),
    "claimed pax header": (lambda declared: with_checksum(header("././@PaxHeader", declared, b"x", base256(declared)))
                           + b"x" * 512,
                           lambda declared: f"the extended header at byte 0 declares {declared:,} bytes, more than the "
                                            "1,048,576 this reader reads"),
    "claimed long name": (lambda declared: with_checksum(header("././@LongLink", declared, b"L", base256(declared)))
                          + b"x" * 512,
                          lambda declared: f"the extended header at byte 0 declares {declared:,} bytes, more than the "
                                           "1,048,576 this reader reads"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_claimed_size_costs_no_memory(case):
    """A member that declares 256 MiB with 512 bytes stored: the reading's peak memory is a
    block of the shard, not the declaration, and the error names the member."""
    build, message = HOSTILE[case]
    declared = 2**28
    data = build(declared)
    for call in (lambda: samples(data), lambda: count(data)):
        tracemalloc.start()
        try:
            assert error_of(call) == f"{SHARD}: {message(declared)}"
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 2**20


@pytest.mark.parametrize("case", ["GNU sparse member", "pax sparse member"])
def test_a_sparse_member_declaring_8_gib_is_refused_in_a_fenced_process(tmp_path, case):
    """Issue 33: the member tarfile expands to its declared 8 GiB (its hole filled with
    zeros) is refused, reading and counting, in a process that cannot map 8 GiB."""
    build, message = HOSTILE[case]
    path = tmp_path / "shard.tar"
    path.write_bytes(build(GIB8))
    expected = f"ValueError: {path}: {message(GIB8)}"
    assert outcome(f"list(WebDatasetReader()(open({str(path)!r}, 'rb')))") == expected
    assert outcome(f"WebDatasetReader().count(open({str(path)!r}, 'rb'))") == expected


def member_of(kind: bytes, size: int = 0, name: str = "a.bin") -> bytes:
    return with_checksum(header(name, size, kind)) + padded(b"x" * size)


@pytest.mark.parametrize("data, message", [
    (member_of(b"V"), "tar member 'a.bin' (at byte 0) has type b'V', which this reader does not read"),
    (member_of(b"M", 10), "tar member 'a.bin' (at byte 0) has type b'M', which this reader does not read"),
    (member_of(b"5", 10, "dir"), "tar member 'dir' (at byte 0) is a directory that declares 10 bytes of data; tar "
                                 "writers write none"),
    (member_of(b"1", 600), "tar member 'a.bin' (at byte 0) is a hard link that declares 600 bytes of data; tar "
                           "writers write none"),
    (pax_block({"path": "x.bin"}, b"g") + member_of(b"0", 3),
     "the global pax header before tar member 'a.bin' (at byte 0) sets path for every member after it, which this "
     "reader refuses"),
    (pax_block({"size": "1x"}) + member_of(b"0", 3), "tar member 'a.bin' (at byte 0): its pax size b'1x' is not a "
                                                    "number of bytes"),
    (pax_block({"path": "x.bin"})[:BLOCK] + padded(b"99 path=x.bin\n") + member_of(b"0", 3),
     "tar member 'a.bin' (at byte 0): its pax record at byte 0 is not '<length> <keyword>=<value>\\n'"),
    (member_of(b"0", 3), "the shard ends at byte 1,024 after tar member 'a.bin' without tar's end-of-archive block: "
                         "it is truncated"),
    (b"", "the shard is empty, not a tar archive"),
    (b"x" * 700, "tar header at byte 0 is damaged: its checksum field b'xxxxxxxx' is not an octal number"),
    (member_of(b"0", 3)[:100] + b"\xff" + member_of(b"0", 3)[101:] + END,
     "tar header at byte 0 is damaged: its checksum does not match its bytes"),
    (b"\x28\xb5\x2f\xfd" + bytes(600), "the shard is compressed with zstd, which this reader does not read (it reads "
                                        "gzip, bzip2, xz and plain tar)"),
    (gzip.compress(member_of(b"0", 3) + END, mtime=0)[:-12], "the shard's gzip stream is damaged (EOFError: Compressed file "
                                                     "ended before the end-of-stream marker was reached)"),
])
def test_what_the_reader_does_not_read_is_one_error_naming_the_shard(data, message):
    assert error_of(lambda: samples(data)) == f"{SHARD}: {message}"
    assert error_of(lambda: count(data)) == f"{SHARD}: {message}"


def test_a_damaged_header_is_named_by_its_byte_and_the_member_before_it():
    data = bytearray(tar_bytes([("a.jpg", b"1"), ("b.jpg", b"2")]))
    data[1024 + 5] ^= 1
    message = "mem://shard: tar header at byte 1024 (after tar member 'a.jpg') is damaged: its checksum does not match its bytes"
    assert error_of(lambda: samples(bytes(data))) == message
    assert error_of(lambda: count(bytes(data))) == message


# Compression, large members, counting by headers

@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress,
                                      lambda data: lzma.compress(data, format=lzma.FORMAT_ALONE)])
def test_a_compressed_shard_reads_as_its_plain_tar(compress):
    plain = WDS
    assert samples(compress(plain)) == samples(plain)
    assert count(compress(plain)) == count(plain) == 3
    assert WebDatasetReader().count(Pipe(compress(plain))) == 3


def test_a_name_that_looks_like_a_magic_number_is_a_name():
    data = tar_bytes([("BZh91AY.txt", b"not bzip2")])
    assert samples(data) == [{"__key__": "BZh91AY", "txt": b"not bzip2"}]


@pytest.mark.parametrize("read_bytes", [512, 4096, 1 << 18])
def test_members_larger_than_a_read_keep_every_byte(read_bytes):
    large = bytes(range(256)) * 4099 + b"tail"  # 1 MiB and a bit: not a whole number of blocks
    data = tar_bytes([("a.bin", large), ("a.txt", b"small"), ("b.bin", large[::-1])])
    assert members(data, read_bytes) == [("a.bin", large), ("a.txt", b"small"), ("b.bin", large[::-1])]
    assert members(data, read_bytes, Pipe) == members(data, read_bytes)


def test_counting_reads_the_headers_not_the_data():
    data = tar_bytes([(f"{index:04}.jpg", bytes(100_000)) for index in range(50)])
    file = CountingFile(data)
    assert WebDatasetReader().count(file) == 50
    assert file.bytes_read < len(data) // 10
    assert WebDatasetReader().count(Pipe(data)) == 50


def test_shard_files_on_disk(tmp_path: Path):
    path = tmp_path / "shard.tar"
    path.write_bytes(WDS)
    with open(path, "rb") as file:
        assert list(WebDatasetReader()(file)) == tarfile_samples(WDS)
    with open(path, "rb", buffering=0) as file:
        assert WebDatasetReader().count(file) == 3

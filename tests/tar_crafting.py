"""Tar shards built byte by byte, for the tar reader's tests: what tarfile writes, what
WebDataset's TarWriter writes, and what no writer writes (sparse members, sizes a header
claims but the shard does not hold, damaged blocks), plus the reading `tarfile` does of
them, which the reader is compared with."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from typing import Any

from dist_resume.streams.formats.webdataset import SampleKeys

BLOCK = 512
END = bytes(2 * BLOCK)  # tar's end-of-archive blocks


def with_checksum(block: bytearray) -> bytes:
    """`block` with its checksum field set to the sum of its bytes, as tar writers write it."""
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def header(name: str, size: int, kind: bytes = b"0", size_field: bytes | None = None) -> bytearray:
    """A GNU-format header block of a member `name` of `size` bytes and type `kind`, its
    checksum not yet set; `size_field` replaces the size's 12 bytes (a base-256 size, say)."""
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT)[-BLOCK:])
    if size_field is not None:
        block[124:136] = size_field
    return block


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def base256(value: int) -> bytes:
    """GNU tar's 12-byte base-256 form of a number too large for 11 octal digits."""
    return b"\x80" + value.to_bytes(11, "big")


def gnu_sparse(name: str, declared: int, stored: bytes) -> bytes:
    """A tar of one old-GNU sparse member (type S) of `declared` bytes, of which `stored`,
    at the end, are stored: the rest is a hole that a reader would fill with zeros."""
    block = header(name, len(stored), b"S")
    block[386:398] = b"%011o\0" % (declared - len(stored)) if declared < 8**11 else base256(declared - len(stored))
    block[398:410] = b"%011o\0" % len(stored)
    block[483:495] = b"%011o\0" % declared if declared < 8**11 else base256(declared)
    return with_checksum(block) + padded(stored) + END


def pax_block(records: dict[str, str], kind: bytes = b"x") -> bytes:
    """A pax extended header of `records`, with its data."""
    data = b""
    for keyword, value in records.items():
        record = f" {keyword}={value}\n".encode()
        length = len(record) + len(str(len(record)))
        length = len(record) + len(str(length))
        data += str(length).encode() + record
    return with_checksum(header("././@PaxHeader", len(data), kind)) + padded(data)


def pax_sparse(name: str, declared: int, stored: bytes) -> bytes:
    """A tar of one member in GNU's pax sparse format 1.0: a sparse map, then `stored`, the
    data at the end of `declared` bytes."""
    sparse_map = padded(b"1\n%d\n%d\n" % (declared - len(stored), len(stored)))
    extended = pax_block({"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": name,
                          "GNU.sparse.realsize": str(declared)})
    member = with_checksum(header(f"GNUSparseFile.0/{name}", len(sparse_map) + len(stored)))
    return extended + member + sparse_map + padded(stored) + END


def claimed(name: str, declared: int, stored: bytes) -> bytes:
    """A tar of one regular member whose header claims `declared` bytes (base-256 when
    large) while the shard holds `stored`."""
    field = base256(declared) if declared >= 8**11 else None
    return with_checksum(header(name, declared, size_field=field)) + padded(stored)


def tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    """(name, data) of each regular file, as Python's tarfile reads the tar `data`."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tar:
        return [(member.name, tar.extractfile(member).read()) for member in tar if member.isfile()]


def tarfile_samples(data: bytes, where: str = "mem://shard") -> list[dict[str, Any]]:
    """The samples of the tar `data` as the tarfile-based reader of the previous release
    read them: tarfile's members, grouped by `SampleKeys`."""
    keys, samples = SampleKeys(where), []
    for name, payload in tarfile_members(data):
        key, extension, starts = keys.place(name)
        if starts:
            samples.append({"__key__": key})
        samples[-1][extension] = payload
    return samples


def tarfile_samples_completed(data: bytes, where: str = "mem://shard") -> list[dict[str, Any]]:
    """The samples that reading the (possibly damaged) tar `data` as the previous release
    did completes before anything stops it: each sample whose next sample had begun when
    tarfile stopped (silently or with an error) or `SampleKeys` refused a name. A streaming
    reader yields no other samples before its error."""
    keys, samples = SampleKeys(where), []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tar:
            for member in tar:
                if member.isfile():
                    key, extension, starts = keys.place(member.name)
                    if starts:
                        samples.append({"__key__": key})
                    samples[-1][extension] = tar.extractfile(member).read()
    except (tarfile.TarError, ValueError):
        pass
    return samples[:-1]


def webdataset_tar(samples: Sequence[dict[str, Any]]) -> bytes:
    """`samples` as WebDataset's TarWriter writes them: its default format (pax, a header
    before every file: a float modification time does not fit ustar), user and group
    'bigdata', mode 0o444, the files of a sample in sorted order."""
    import webdataset

    sink = io.BytesIO()
    with webdataset.TarWriter(sink) as writer:
        for sample in samples:
            writer.write(sample)
    return sink.getvalue()

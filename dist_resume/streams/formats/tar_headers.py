"""The 512-byte header blocks of a tar archive (ustar, GNU and pax) and the records of pax
extended headers, read as Python's `tarfile` reads them for every archive it writes, and
more strictly for damaged or crafted ones: a header whose checksum, size or name field is
not what a tar writer writes is a `MalformedHeader`, never a guess."""

from __future__ import annotations

import struct
from zlib import adler32

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)  # the end of an archive
REGULAR = (b"0", b"\0", b"7")  # a file, an old-style file, a contiguous file: data that is a sample's
DATALESS = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device",
            b"5": "directory", b"6": "FIFO"}
LONG_NAME, LONG_LINK, SPARSE = b"L", b"K", b"S"  # GNU's
PAX_LOCAL, PAX_SOLARIS, PAX_GLOBAL = b"x", b"X", b"g"
EXTENSIONS = (PAX_LOCAL, PAX_SOLARIS, PAX_GLOBAL, LONG_NAME, LONG_LINK)  # headers that describe the next member
GNU_MAGIC = b"ustar  \0"
OCTAL_DIGITS = b"01234567"
# The fields a member's reading needs: name, size (11 digits, their end), checksum (6 digits,
# their end), type flag, magic and version, prefix.
HEADER = struct.Struct("100s24x11sc12x6s2sc100x8s80x155s12x")
PAX_LENGTH_DIGITS = 20  # tarfile's bound on a record's length field


class MalformedHeader(Exception):
    """A header block or pax record that no tar writer writes; the message says which field."""


def text(field: bytes) -> str:
    """A NUL-terminated name field as tarfile decodes it (UTF-8, undecodable bytes kept as
    surrogates, so that names compare equal to tarfile's)."""
    end = field.find(0)
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


def number(field: bytes, what: str) -> int:
    """A numeric field: octal digits (between spaces or NULs, as writers pad them) or GNU's
    base-256 for large values. A negative base-256 value or any other character is refused
    (tarfile would read ``-1`` or ``0o7`` as numbers)."""
    first = field[0]
    if first == 0x80:
        return int.from_bytes(field[1:], "big")
    if first == 0xFF:
        raise MalformedHeader(f"its {what} field is negative")
    end = field.find(0)
    digits = (field if end < 0 else field[:end]).strip()
    if digits.translate(None, OCTAL_DIGITS):
        raise MalformedHeader(f"its {what} field {field!r} is not an octal number")
    return int(digits, 8) if digits else 0


def byte_sum(block: bytes) -> int:
    """The sum of a block's bytes, as tar's checksum counts them (unsigned)."""
    # adler32's low half is 1 + the sum, modulo 65521: exact for a block of ASCII bytes
    # (at most 512 * 127), and for each half of any block (at most 256 * 255).
    if block.isascii():
        return (adler32(block) & 0xFFFF) - 1
    return (adler32(block[:256]) & 0xFFFF) + (adler32(block[256:]) & 0xFFFF) - 2


def check_sum(block: bytes) -> None:
    """Refuses a block whose stored checksum is neither the unsigned nor the signed sum of its
    bytes (the checksum field counted as spaces), as tarfile does."""
    stored = number(block[148:156], "checksum")
    unsigned = byte_sum(block) - sum(block[148:156]) + 256
    if stored != unsigned and stored != unsigned - 256 * sum(byte >= 0x80 for byte in block[:148] + block[156:]):
        raise MalformedHeader("its checksum does not match its bytes")


def parse_header(block: bytes) -> tuple[bytes, str, int]:
    """(type flag, name, size) of a header block that is not all zeros: the name with a ustar
    prefix joined (a GNU header's prefix bytes hold times instead, and are not a name), a
    directory's trailing slashes removed; an extended header's name is not read ("")."""
    name, digits, digits_end, checksum, checksum_end, kind, magic, prefix = HEADER.unpack(block)
    # The fast path reads the fields as tarfile and GNU tar write them ("%06o\0 " and
    # "%011o\0"); anything else takes the general rules.
    try:
        if not (checksum_end == b"\0 " and block.isascii()
                and int(checksum, 8) == (adler32(block) & 0xFFFF) + 223 - sum(checksum)):
            check_sum(block)
        size = int(digits, 8) if digits_end == b"\0" and digits.isdigit() else number(block[124:136], "size")
    except ValueError:  # an 8 or a 9, or no digits
        check_sum(block)
        size = number(block[124:136], "size")
    if kind in EXTENSIONS:
        return kind, "", size
    end = name.find(0)
    name = (name if end < 0 else name[:end]).decode("utf-8", "surrogateescape")
    if kind != b"0":
        if kind == b"\0" and name.endswith("/"):  # the oldest tars mark a directory by its name alone
            kind = b"5"
        if kind == b"5":
            name = name.rstrip("/")
    if prefix[0] and magic != GNU_MAGIC and kind != SPARSE:
        name = f"{text(prefix)}/{name}"
    return kind, name, size


def pax_records(data: bytes) -> dict[bytes, bytes]:
    """keyword -> value of the records ``<length> <keyword>=<value>\\n`` that fill ``data``
    (trailing NULs allowed, as tarfile allows them); a record that is not so framed is a
    `MalformedHeader` naming its offset. A later record of a keyword replaces an earlier one."""
    records = {}
    position, end = 0, len(data)
    while position < end and data[position]:
        space = data.find(b" ", position, position + PAX_LENGTH_DIGITS + 1)
        digits = data[position:space]
        length = int(digits) if space > position and digits.isdigit() else 0
        stop = position + length
        keyword, equals, value = data[space + 1:stop - 1].partition(b"=")
        if length < 5 or stop > end or data[stop - 1] != 0x0A or not keyword or not equals:
            raise MalformedHeader(f"its pax record at byte {position} is not '<length> <keyword>=<value>\\n'")
        records[keyword] = value
        position = stop
    return records


def pax_size(records: dict[bytes, bytes]) -> int | None:
    """The member size a pax header sets (None: it sets none)."""
    value = records.get(b"size")
    if value is None:
        return None
    if not value.isdigit():
        raise MalformedHeader(f"its pax size {value!r} is not a number of bytes")
    return int(value)

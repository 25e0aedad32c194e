"""Counting a zip's entries from its raw bytes, before ``zipfile`` reads the central directory.

``zipfile.ZipFile`` builds a ZipInfo object for every central-directory entry as it opens the
archive: 250,000 entries in a 21 MiB upload cost seconds of CPU and over 100 MiB before any
entry cap could apply. So the archive's End Of Central Directory record (and its ZIP64
successor) is parsed here from the tail, found exactly as ``zipfile`` finds it, and the
central directory is walked header by header (fixed 46-byte headers, names never decoded)
up to the cap. Both the count the record declares and the headers actually present are
checked: a record can understate its count, and ``zipfile`` trusts the directory's size,
not the count.
"""

from __future__ import annotations

import mmap
import struct

from ..errors import UnsafeArchive

# The archive in memory, or mapped from its spooled file.
Buffer = bytes | bytearray | mmap.mmap

_EOCD = struct.Struct("<4s4H2LH")  # signature, disks, entries here, entries, size, offset, comment
_EOCD_SIG = b"PK\x05\x06"
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_LOCATOR_SIG = b"PK\x06\x07"
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_ZIP64_EOCD_SIG = b"PK\x06\x06"
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_CENTRAL_SIG = b"PK\x01\x02"
_MAX_COMMENT = 0xFFFF


def _has(data: Buffer, signature: bytes, at: int) -> bool:
    # A slice rather than startswith(), which an mmap lacks.
    return data[at : at + len(signature)] == signature


def _end_record(data: Buffer) -> tuple[int, int, int, int] | None:
    """(entries declared, central directory size, record position, bytes of ZIP64 records),
    or None when there is no record (zipfile will refuse the archive itself)."""
    size = len(data)
    if size < _EOCD.size:
        return None
    # As zipfile: a record with no comment at the very end, else the last signature within
    # the last 64 KiB + 22 bytes.
    tail = data[-_EOCD.size :]
    if tail.startswith(_EOCD_SIG) and tail[-2:] == b"\0\0":
        pos = size - _EOCD.size
    else:
        start = max(size - _MAX_COMMENT - 1 - _EOCD.size, 0)
        found = data.rfind(_EOCD_SIG, start)
        if found < 0 or found + _EOCD.size > size:
            return None
        pos = found
    _, _, _, here, total, cd_size, _, _ = _EOCD.unpack_from(data, pos)
    declared = max(here, total)
    extra = 0
    locator_at = pos - _ZIP64_LOCATOR.size
    if locator_at >= 0 and _has(data, _ZIP64_LOCATOR_SIG, locator_at):
        record_at = locator_at - _ZIP64_EOCD.size
        if record_at >= 0 and _has(data, _ZIP64_EOCD_SIG, record_at):
            fields = _ZIP64_EOCD.unpack_from(data, record_at)
            here64, total64, cd_size = fields[6], fields[7], fields[8]
            declared = max(here64, total64)
            extra = _ZIP64_EOCD.size + _ZIP64_LOCATOR.size
    return declared, cd_size, pos, extra


def check_entry_count(data: Buffer, limit: int) -> None:
    """Refuse a zip whose central directory declares or holds more than ``limit`` entries.

    Reads only fixed-size headers of the bytes in hand; never builds a ZipFile.
    """
    record = _end_record(data)
    if record is None:
        return
    declared, cd_size, pos, extra = record
    if declared > limit:
        raise UnsafeArchive(
            f"the zip's central directory declares {declared} entries; the limit is {limit}"
        )
    # Where zipfile will read the directory: right before the end records (an archive may
    # have bytes prepended, which moves every offset by the same amount).
    start = pos - extra - cd_size
    if start < 0:
        return  # zipfile refuses it: "Bad offset for central directory"
    end = start + cd_size
    count = 0
    at = start
    while at < end:
        if at + _CENTRAL.size > end or not _has(data, _CENTRAL_SIG, at):
            return  # truncated or corrupt: zipfile refuses it, with its own words
        header = _CENTRAL.unpack_from(data, at)
        name_len, extra_len, comment_len = header[12], header[13], header[14]
        at += _CENTRAL.size + name_len + extra_len + comment_len
        count += 1
        if count > limit:
            raise UnsafeArchive(
                f"the zip's central directory holds more than {limit} entries; the limit is {limit}"
            )

"""A zip's entry count is checked from its raw end records, before zipfile reads the directory."""

from __future__ import annotations

import io
import struct
import tempfile
import zipfile
from typing import Any

import pytest

from gate_service.bundles import archive
from gate_service.bundles.archive import MAX_ENTRIES, read_archive
from gate_service.bundles.zipdir import check_entry_count
from gate_service.errors import UnsafeArchive

LOCAL = b"PK\x03\x04" + b"\0" * 26  # a local header's worth of bytes: looks like a zip


def eocd(entries: int) -> bytes:
    """A classic End Of Central Directory record claiming ``entries`` (at most 65,535)."""
    return struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, entries, entries, 0, 0, 0)


def _zip64_tail(entries: int, comment: bytes = b"") -> bytes:
    """ZIP64 end records claiming ``entries``, with no directory: zipfile would read it."""
    record_at = len(LOCAL)
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, 0, 0)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, record_at, 1)
    end = struct.pack(
        "<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, len(comment)
    )
    return record + locator + end + comment


def real_zip(entries: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for i in range(entries):
            z.writestr(f"tests/files/f{i}.txt", b"")
    return buf.getvalue()


@pytest.fixture(scope="module")
def over_cap() -> bytes:
    """A real zip of 10,001 tiny entries, made before any test forbids ZipFile."""
    return real_zip(MAX_ENTRIES + 1)


@pytest.fixture
def no_zipfile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make building a ZipFile fail loudly: the refusal must come before it."""

    def refuse(*_: Any, **__: Any) -> zipfile.ZipFile:
        raise AssertionError("zipfile.ZipFile was constructed")

    monkeypatch.setattr(archive.zipfile, "ZipFile", refuse)


def test_an_eocd_claiming_250000_entries_is_refused_before_zipfile_reads_it(
    no_zipfile: None,
) -> None:
    data = LOCAL + _zip64_tail(250_000)
    with pytest.raises(UnsafeArchive) as refused:
        read_archive(data)
    assert refused.value.detail == (
        "the zip's central directory declares 250000 entries; the limit is 10000"
    )


def test_a_classic_eocd_over_the_cap_is_refused_too(no_zipfile: None) -> None:
    # The classic record holds at most 65,535; 60,000 is over the cap without ZIP64.
    with pytest.raises(UnsafeArchive, match="declares 60000 entries; the limit is 10000"):
        read_archive(LOCAL + eocd(60_000))


def test_an_eocd_behind_an_archive_comment_is_found(no_zipfile: None) -> None:
    with pytest.raises(UnsafeArchive, match="declares 250000 entries"):
        read_archive(LOCAL + _zip64_tail(250_000, comment=b"PK hello " * 100))


def test_a_real_zip_of_10001_entries_is_refused_before_zipfile(
    over_cap: bytes, no_zipfile: None
) -> None:
    data = over_cap
    with pytest.raises(UnsafeArchive) as refused:
        read_archive(data)
    assert refused.value.detail == (
        "the zip's central directory declares 10001 entries; the limit is 10000"
    )


def test_an_eocd_that_understates_its_count_is_caught_by_the_header_walk(
    over_cap: bytes, no_zipfile: None
) -> None:
    data = bytearray(over_cap)
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<2H", data, end + 8, 1, 1)  # "one entry"; 10,001 headers follow
    with pytest.raises(UnsafeArchive) as refused:
        read_archive(bytes(data))
    assert refused.value.detail == (
        "the zip's central directory holds more than 10000 entries; the limit is 10000"
    )


@pytest.mark.slow
def test_a_zip_at_the_cap_passes_the_count_and_is_read_normally() -> None:
    data = real_zip(MAX_ENTRIES)
    check_entry_count(data, MAX_ENTRIES)  # no refusal
    manifest = read_archive(data)
    assert len(manifest.files) == MAX_ENTRIES


def test_prepended_bytes_do_not_hide_the_directory(over_cap: bytes, no_zipfile: None) -> None:
    # zipfile finds a directory moved by prepended bytes; so must the count.
    data = bytearray(b"PK\x03\x04" + b"x" * 1000 + over_cap)
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<2H", data, end + 8, 3, 3)
    with pytest.raises(UnsafeArchive, match="holds more than 10000 entries"):
        read_archive(bytes(data))


def test_garbage_without_an_end_record_is_left_to_zipfile() -> None:
    check_entry_count(LOCAL + b"\0" * 100, MAX_ENTRIES)  # nothing to count: no refusal here
    with pytest.raises(UnsafeArchive, match=r"not a readable \.zip"):
        read_archive(LOCAL + b"\0" * 100)


def spooled(data: bytes, *, in_memory: bool) -> Any:
    """The archive as an upload arrives: a SpooledTemporaryFile, still in memory or on disk."""
    file = tempfile.SpooledTemporaryFile(max_size=len(data) + 1 if in_memory else 1)
    file.write(data)
    assert file._rolled is not in_memory  # type: ignore[attr-defined]
    return file


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_spooled_upload_is_counted_the_same_from_its_file(
    over_cap: bytes, no_zipfile: None, in_memory: bool
) -> None:
    # On disk, the end records and directory are read through a memory map of the file.
    with spooled(over_cap, in_memory=in_memory) as file, pytest.raises(UnsafeArchive) as refused:
        read_archive(file)
    assert refused.value.detail == (
        "the zip's central directory declares 10001 entries; the limit is 10000"
    )
    with spooled(LOCAL + _zip64_tail(250_000), in_memory=in_memory) as file:
        with pytest.raises(UnsafeArchive, match="declares 250000 entries"):
            read_archive(file)


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_spooled_upload_reads_to_the_same_manifest_as_its_bytes(in_memory: bool) -> None:
    data = real_zip(3)
    with spooled(data, in_memory=in_memory) as file:
        file.seek(2)  # wherever it was left, the archive is read from its start
        assert read_archive(file) == read_archive(data)

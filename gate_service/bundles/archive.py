"""Reading untrusted bundle archives (.tar.gz / .zip) without trusting anything they claim.

Both formats go through one walk: every entry's name is checked before anything is read,
only regular files and directories are accepted, and sizes are counted from the bytes
actually decompressed, never from headers. Extraction writes only below a fresh directory,
creating each file with O_EXCL so nothing already there can be followed or overwritten.
"""

from __future__ import annotations

import gzip
import io
import mmap
import os
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO

from ..errors import PayloadTooLarge, UnsafeArchive, UnsupportedMediaType
from .zipdir import check_entry_count

MIB = 1024 * 1024
TOTAL_LIMIT_BYTES = 25 * MIB  # spec §1: everything together
CODE_LIMIT_BYTES = 5 * MIB  # spec §1: everything outside tests/files/
# What skipped entries (hidden files, caches) may add on top before we stop decompressing.
SKIPPED_LIMIT_BYTES = 25 * MIB
MAX_ENTRIES = 10_000
MAX_DEPTH = 32
MAX_PATH_CHARS = 1024
MAX_NAME_CHARS = 255
CHUNK = 64 * 1024

# connic-composer-sdk 0.1.57 uploads connectors/ as well (spec §1 predates it); what its CLI
# and `gate submit` pack is what the gate keeps.
UPLOAD_ROOTS = (
    "agents", "tools", "middleware", "schemas", "guardrails", "hooks", "tests", "connectors",
)  # fmt: skip
ROOT_FILES = ("requirements.txt",)
CODE_EXTENSIONS = frozenset(
    {".py", ".yaml", ".yml", ".txt", ".json", ".csv", ".md", ".toml", ".jsonl"}
)
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass
class Manifest:
    """What an archive holds, counted as it is read: the running totals make each entry's
    limit check constant time (summing every file per entry made a 10,000-entry archive
    quadratic: seconds of an API thread per upload)."""

    archive_format: str
    files: dict[str, int] = field(default_factory=dict)  # kept path -> bytes
    skipped: list[str] = field(default_factory=list)
    fixture_bytes: int = 0  # of files under tests/files/
    code_bytes: int = 0  # of every other file

    def __post_init__(self) -> None:
        files, self.files = self.files, {}
        for path, size in files.items():
            self.add(path, size)

    def add(self, path: str, size: int) -> None:
        """Keep ``path`` of ``size`` bytes (replacing what was kept under that path)."""
        fixture = path.startswith("tests/files/")
        change = size - self.files.get(path, 0)
        self.files[path] = size
        if fixture:
            self.fixture_bytes += change
        else:
            self.code_bytes += change

    @property
    def total_bytes(self) -> int:
        return self.fixture_bytes + self.code_bytes

    def largest(self, *, code_only: bool = False, n: int = 5) -> list[dict[str, int | str]]:
        items = [
            (p, b)
            for p, b in self.files.items()
            if not (code_only and p.startswith("tests/files/"))
        ]
        items.sort(key=lambda item: -item[1])
        return [{"path": p, "bytes": b} for p, b in items[:n]]


def detect_format(head: bytes) -> str:
    """Tell the format from the first bytes; a file name or content type proves nothing."""
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    raise UnsupportedMediaType(
        "the bundle is neither a gzip-compressed tar (.tar.gz/.tgz) nor a zip archive; "
        f"it starts with {head[:8]!r}"
    )


def _shown(raw: str) -> str:
    """A name as it can be shown in an error, whatever bytes it holds."""
    return repr(raw.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"))


def check_name(raw: str) -> PurePosixPath:
    """Refuse names that could point anywhere but below the extraction root."""
    if not raw or any(ord(ch) < 32 or ord(ch) == 127 for ch in raw):
        raise UnsafeArchive(f"entry {_shown(raw)} is empty or holds control characters")
    try:
        encoded = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeArchive(f"entry name {_shown(raw)} is not valid UTF-8") from None
    if "\\" in raw:
        raise UnsafeArchive(f"entry {raw!r} contains a backslash")
    if raw.startswith("/") or _DRIVE.match(raw):
        raise UnsafeArchive(f"entry {raw!r} has an absolute path")
    if len(encoded) > MAX_PATH_CHARS:
        raise UnsafeArchive(f"entry name is {len(encoded)} bytes; the limit is {MAX_PATH_CHARS}")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if not parts:
        raise UnsafeArchive(f"entry {raw!r} names the archive root")
    if ".." in parts:
        raise UnsafeArchive(f"entry {raw!r} contains '..'")
    if len(parts) > MAX_DEPTH:
        raise UnsafeArchive(f"entry {raw!r} is {len(parts)} levels deep; the limit is {MAX_DEPTH}")
    for part in parts:
        if len(part.encode("utf-8")) > MAX_NAME_CHARS:
            raise UnsafeArchive(
                f"a path component of {raw!r} exceeds {MAX_NAME_CHARS} characters (bytes)"
            )
    return PurePosixPath(*parts)


def _upload_decision(path: PurePosixPath) -> str | None:
    """None to keep the file; otherwise why it is left out of the upload set (spec §1)."""
    parts = path.parts
    if (
        any(p.startswith(".") for p in parts)
        or "__pycache__" in parts
        or "__MACOSX" in parts
        or path.suffix == ".pyc"
    ):
        return "hidden or cache file"
    if len(parts) == 1:
        return None if parts[0] in ROOT_FILES else "outside the upload set"
    if parts[0] not in UPLOAD_ROOTS:
        return "outside the upload set"
    return None


def _check_extension(path: PurePosixPath) -> str | None:
    text = path.as_posix()
    if text.startswith("tests/files/"):
        return None
    if text.startswith("tests/builders/") and path.suffix != ".py":
        return f"{text}: builders must be .py files"
    if path.suffix.lower() not in CODE_EXTENSIONS:
        allowed = " ".join(sorted(CODE_EXTENSIONS))
        ext = path.suffix or "(none)"
        return f"{text}: extension {ext!r} is not allowed outside tests/files/ ({allowed})"
    return None


@dataclass(frozen=True)
class _Entry:
    name: str
    kind: str  # "file" | "dir" | a refusal label
    open: Callable[[], IO[bytes]] | None


class _CappedStream(io.RawIOBase):
    """A decompressed stream that refuses to yield more than ``cap`` bytes (bomb guard)."""

    def __init__(self, inner: IO[bytes], cap: int) -> None:
        self.inner, self.cap, self.count = inner, cap, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        chunk = self.inner.read(size if size >= 0 else CHUNK)
        self.count += len(chunk)
        if self.count > self.cap:
            raise PayloadTooLarge(
                f"the archive decompresses to more than {self.cap} bytes; "
                f"the limit is {TOTAL_LIMIT_BYTES} bytes of files (compression bomb?)"
            )
        return chunk


# Files plus what skipped entries may hold, plus room for tar headers and padding.
DECOMPRESSED_CAP_BYTES = TOTAL_LIMIT_BYTES + SKIPPED_LIMIT_BYTES + 16 * MIB


def _opener(archive: tarfile.TarFile, member: tarfile.TarInfo) -> Callable[[], IO[bytes]]:
    def open_member() -> IO[bytes]:
        handle = archive.extractfile(member)
        if handle is None:  # pragma: no cover - isreg() members always have data
            raise UnsafeArchive(f"entry {member.name!r} has no data")
        return handle

    return open_member


MAX_EXTENDED_HEADER_BYTES = 64 * 1024
_EXTENDED_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                   tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)  # fmt: skip


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses what tarfile would otherwise read into memory whole: huge PAX or GNU long-name
    headers, and sparse members (whose maps can be made enormous)."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED_TYPES and self.size > MAX_EXTENDED_HEADER_BYTES:
            raise UnsafeArchive(
                f"a tar extended header of {self.size} bytes; the limit is "
                f"{MAX_EXTENDED_HEADER_BYTES}"
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise UnsafeArchive(f"entry {self.name!r} is a sparse file; sparse files are refused")
        return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]


_TAR_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error, ValueError, OverflowError)


# An archive in hand: bytes, or a seekable file (an upload spooled to disk), which is read
# as a stream and never loaded whole.
Source = bytes | bytearray | IO[bytes]


def _from_start(source: Source) -> IO[bytes]:
    if isinstance(source, bytes | bytearray):
        return io.BytesIO(source)
    source.seek(0)
    return source


@contextmanager
def _random_access(source: Source) -> Iterator[bytes | bytearray | mmap.mmap]:
    """The archive as a buffer to find the zip's end records in: a file is mapped, not read,
    so only the pages looked at (its tail, its central directory) are ever in memory."""
    if isinstance(source, bytes | bytearray):
        yield source
        return
    source.seek(0, os.SEEK_END)
    size = source.tell()
    try:
        fd = source.fileno()  # a SpooledTemporaryFile moves to disk here
    except (OSError, io.UnsupportedOperation):
        fd = -1
    if fd < 0 or size == 0:
        source.seek(0)
        yield source.read()
        return
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
        yield mapped


def _tar_entries(source: Source) -> Iterator[_Entry]:
    gz: IO[bytes] = gzip.GzipFile(fileobj=_from_start(source), mode="rb")  # type: ignore[assignment]
    stream = _CappedStream(gz, DECOMPRESSED_CAP_BYTES)
    try:
        archive = tarfile.open(fileobj=stream, mode="r|", tarinfo=_BoundedTarInfo)
    except _TAR_ERRORS as exc:
        raise UnsafeArchive(f"not a readable .tar.gz: {exc}") from None
    with archive:
        try:
            for member in archive:
                if member.issparse():
                    yield _Entry(member.name, "sparse file", None)
                elif member.isreg():
                    yield _Entry(member.name, "file", _opener(archive, member))
                elif member.isdir():
                    yield _Entry(member.name, "dir", None)
                elif member.issym():
                    yield _Entry(member.name, "symbolic link", None)
                elif member.islnk():
                    yield _Entry(member.name, "hard link", None)
                elif member.isfifo():  # before isdev(), which counts FIFOs as devices
                    yield _Entry(member.name, "FIFO", None)
                elif member.isdev():
                    yield _Entry(member.name, "device node", None)
                else:
                    yield _Entry(member.name, f"tar member of type {member.type!r}", None)
        except _TAR_ERRORS as exc:
            raise UnsafeArchive(f"the .tar.gz is truncated or corrupt: {exc}") from None


_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)


def _zip_entries(source: Source) -> Iterator[_Entry]:
    # Counted from the raw end records and headers first: ZipFile() reads the whole central
    # directory into objects, which a 250,000-entry zip makes slow and large.
    with _random_access(source) as data:
        check_entry_count(data, MAX_ENTRIES)
    try:
        archive = zipfile.ZipFile(_from_start(source))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise UnsafeArchive(f"not a readable .zip: {exc}") from None
    with archive:
        for info in archive.infolist():
            mode = info.external_attr >> 16
            if info.compress_type not in _ZIP_METHODS:
                yield _Entry(
                    info.filename,
                    f"entry compressed with method {info.compress_type} (supported: stored, "
                    "deflate, bzip2, lzma)",
                    None,
                )
                continue
            if info.flag_bits & 0x1:
                yield _Entry(info.filename, "encrypted entry", None)
            elif stat.S_ISLNK(mode):
                yield _Entry(info.filename, "symbolic link", None)
            # Writers often leave the type bits at zero (plain file); only a set, non-file,
            # non-folder type is refused.
            elif stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
                yield _Entry(info.filename, "special file", None)
            elif info.is_dir():
                yield _Entry(info.filename, "dir", None)
            else:
                yield _Entry(info.filename, "file", partial(archive.open, info))


def _is_root(raw: str) -> bool:
    """`./` (what `tar -C dir -czf x.tgz .` writes first) names the root itself."""
    return all(part in ("", ".") for part in raw.split("/"))


def _hidden_top(path: PurePosixPath) -> bool:
    return path.parts[0].startswith((".", "__MACOSX"))


def _strip_wrapper(paths: list[PurePosixPath]) -> str:
    """A bundle made with `tar czf x.tgz myproject/` has one wrapping folder; see through it.

    Hidden tops (macOS Finder adds `__MACOSX/` and `._*` files) do not count as a second
    folder.
    """
    paths = [p for p in paths if not _hidden_top(p)]
    tops = {p.parts[0] for p in paths}
    if len(tops) == 1 and any(len(p.parts) > 1 for p in paths):
        (top,) = tops
        if top not in UPLOAD_ROOTS and top not in ROOT_FILES:
            return top + "/"
    return ""


def read_archive(data: Source, dest: Path | None = None) -> Manifest:
    """Walk the archive, enforce every rule and limit, and extract below ``dest`` if given.

    ``data`` is the archive's bytes or a seekable file of them, read from its start.
    Raises UnsupportedMediaType, UnsafeArchive or PayloadTooLarge with what was wrong.
    """
    fmt = detect_format(_from_start(data).read(8))
    if dest is not None:
        dest.mkdir(parents=True, exist_ok=True)
    entries = _tar_entries if fmt == "tar.gz" else _zip_entries
    # A first pass over names only: every name is checked before any content is read, and
    # the wrapper folder (if any) is found.
    names = [e.name for e in entries(data)] if fmt == "zip" else _tar_names(data)
    if len(names) > MAX_ENTRIES:
        raise UnsafeArchive(f"the archive has {len(names)} entries; the limit is {MAX_ENTRIES}")
    prefix = _strip_wrapper([check_name(n) for n in names if not _is_root(n)])
    manifest = Manifest(archive_format=fmt)
    seen: set[str] = set()
    file_keys: set[str] = set()
    dir_keys: set[str] = set()
    problems: list[str] = []
    skipped_bytes = 0
    for entry in entries(data):
        if _is_root(entry.name) and entry.kind == "dir":
            continue
        path = check_name(entry.name)
        key = path.as_posix()
        if key in seen:
            raise UnsafeArchive(f"the archive holds {key!r} more than once")
        seen.add(key)
        # A path may not be a file in one entry and a folder in another, whatever the order.
        parents = {p.as_posix() for p in path.parents if p.parts}
        if entry.kind != "dir" and key in dir_keys:
            raise UnsafeArchive(f"{key!r} is both a file and a folder in the archive")
        if parents & file_keys:
            raise UnsafeArchive(f"{key!r} lies under {sorted(parents & file_keys)[0]!r}, a file")
        dir_keys.update(parents)
        if entry.kind == "dir":
            dir_keys.add(key)
            continue
        file_keys.add(key)
        if entry.kind != "file" or entry.open is None:
            raise UnsafeArchive(
                f"entry {key!r} is a {entry.kind}; only regular files and folders are allowed"
            )
        if prefix and key.startswith(prefix):
            path = PurePosixPath(key[len(prefix) :])
        elif prefix and not _hidden_top(path):
            raise UnsafeArchive(f"entry {key!r} is outside the bundle's folder {prefix!r}")
        why_skipped = _upload_decision(path)
        target = None
        if why_skipped is None:
            bad_ext = _check_extension(path)
            if bad_ext:
                problems.append(bad_ext)
            elif dest is not None:
                target = _create(dest, path)
        size = _copy_counted(
            entry.open, target, budget=_budget(manifest, path, why_skipped, skipped_bytes)
        )
        if why_skipped is None:
            manifest.add(path.as_posix(), size)
            _check_limits(manifest)
        else:
            manifest.skipped.append(path.as_posix())
            skipped_bytes += size
            if skipped_bytes > SKIPPED_LIMIT_BYTES:
                raise PayloadTooLarge(
                    f"left-out entries (hidden files, caches, files outside the upload set) "
                    f"hold more than {SKIPPED_LIMIT_BYTES} bytes"
                )
    if not manifest.files and not problems:
        left_out = ", ".join(manifest.skipped[:5]) or "nothing"
        raise UnsafeArchive(
            "the bundle holds none of agents/, tools/, middleware/, schemas/, guardrails/, "
            f"hooks/, tests/ or requirements.txt at its top (left out: {left_out})"
        )
    if problems:
        raise UnsafeArchive(
            f"{len(problems)} file(s) are not allowed in a bundle; first: {problems[0]}",
            problems=[{"file": p.split(":", 1)[0], "message": p} for p in problems],
        )
    return manifest


def _tar_names(data: Source) -> list[str]:
    names = []
    for entry in _tar_entries(data):
        names.append(entry.name)
        if len(names) > MAX_ENTRIES:
            break
    return names


def _budget(
    manifest: Manifest, path: PurePosixPath, skipped: str | None, skipped_bytes: int
) -> int:
    """Bytes this entry may decompress to before the archive is refused, +1 to detect excess."""
    if skipped is not None:
        return SKIPPED_LIMIT_BYTES - skipped_bytes + 1
    if path.as_posix().startswith("tests/files/"):
        return TOTAL_LIMIT_BYTES - manifest.total_bytes + 1
    return min(TOTAL_LIMIT_BYTES - manifest.total_bytes, CODE_LIMIT_BYTES - manifest.code_bytes) + 1


def human_bytes(size: int) -> str:
    """``size`` for a person: 512 bytes, 3.2 KiB, 25.0 MiB (with the exact count beside it
    where a limit is at stake: 25.0 MiB may be a byte over 25 MiB)."""
    if size < 1024:
        return f"{size} bytes"
    if size < MIB:
        return f"{size / 1024:.1f} KiB"
    return f"{size / MIB:.1f} MiB"


def _listed(largest: list[dict[str, int | str]]) -> str:
    return ", ".join(f"{item['path']} ({human_bytes(int(item['bytes']))})" for item in largest)


def _check_limits(manifest: Manifest) -> None:
    # Reading stops at the byte that crosses a limit: the sizes are what was read by then
    # (the rest of the archive is never decompressed), so the answer says "after", not "is".
    if manifest.total_bytes > TOTAL_LIMIT_BYTES:
        largest = manifest.largest()
        raise PayloadTooLarge(
            f"the bundle's files total more than {TOTAL_LIMIT_BYTES} bytes (25 MiB) uncompressed:"
            f" reading stopped after {manifest.total_bytes:,} bytes "
            f"({human_bytes(manifest.total_bytes)}); the largest files read: {_listed(largest)}",
            problems=[
                {
                    "limit_bytes": TOTAL_LIMIT_BYTES,
                    "measured_bytes": manifest.total_bytes,
                    "largest": largest,
                }
            ],
        )
    if manifest.code_bytes > CODE_LIMIT_BYTES:
        largest = manifest.largest(code_only=True)
        raise PayloadTooLarge(
            f"files outside tests/files/ total more than {CODE_LIMIT_BYTES} bytes (5 MiB): "
            f"reading stopped after {manifest.code_bytes:,} bytes of them "
            f"({human_bytes(manifest.code_bytes)}); the largest read outside tests/files/: "
            f"{_listed(largest)}",
            problems=[
                {
                    "limit_bytes": CODE_LIMIT_BYTES,
                    "measured_bytes": manifest.code_bytes,
                    "largest": largest,
                }
            ],
        )


def _create(dest: Path, path: PurePosixPath) -> int:
    parent = dest
    for part in path.parts[:-1]:
        parent = parent / part
        try:
            parent.mkdir(mode=0o755)
        except FileExistsError:
            if parent.is_symlink() or not parent.is_dir():
                raise UnsafeArchive(f"{path} collides with a file of the same name") from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(parent / path.name, flags, 0o644)
    except FileExistsError:
        raise UnsafeArchive(f"{path} collides with another entry") from None
    except OSError as exc:
        raise UnsafeArchive(f"{path} cannot be written: {exc.strerror}") from None


def _copy_counted(opener: Callable[[], IO[bytes]], fd: int | None, *, budget: int) -> int:
    """Decompress one entry, counting real bytes; stop at ``budget`` (a bomb never finishes)."""
    total = 0
    try:
        with opener() as src:
            while True:
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total >= budget:
                    break
                if fd is not None:
                    os.write(fd, chunk)
    except (zipfile.BadZipFile, EOFError, NotImplementedError, RuntimeError, *_TAR_ERRORS) as exc:
        raise UnsafeArchive(f"the archive is truncated or corrupt: {exc}") from None
    finally:
        if fd is not None:
            os.close(fd)
    return total

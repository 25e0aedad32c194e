"""Pack a project folder into the upload set, as the format's own CLI does (spec §1, §9.2).

The rules mirror `connic test`'s `_validate_project_files` / `_package_project_files`: the
same folders, skip rules, extensions, 5 MB code / 25 MB total limits, tests/files and
tests/builders rules, symbolic and hard link refusals, with the same messages (a parity test
compares both packers on the same projects). Two differences, both for the gate's sake:

- paths are taken relative to the given root instead of the working directory;
- the archive is reproducible: members sorted, owner and modification time zeroed, gzip
  header time zeroed. The same files give the same bytes, so the same bundle sha256, and the
  service reuses the test image it built for that sha256.

Each file is read once, through a descriptor opened without following links, and the bytes
measured are the bytes packed: a file that changes while packing cannot slip past a limit.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_DIRECTORIES = (
    "agents",
    "tools",
    "middleware",
    "schemas",
    "guardrails",
    "hooks",
    "tests",
    "connectors",
)
ALLOWED_EXTENSIONS = frozenset({".py", ".yaml", ".txt", ".json", ".csv", ".md", ".toml", ".jsonl"})
MAX_UPLOAD_SIZE = 25 * 1024 * 1024
MAX_CODE_SIZE = 5 * 1024 * 1024
TEST_FILES_PREFIX = ("tests", "files")
TEST_BUILDERS_PREFIX = ("tests", "builders")
REQUIREMENTS = "requirements.txt"

_TOTAL_EXCEEDED = f"Total file size exceeds {MAX_UPLOAD_SIZE:,} byte limit"
_CODE_EXCEEDED = (
    f"Code/config size exceeds {MAX_CODE_SIZE:,} byte limit. Move large fixtures into tests/files/."
)


class PackError(ValueError):
    """The project cannot be uploaded; the message says which file and why."""


class OverLimit(PackError):
    """The project is over a size limit. The message is the format CLI's (the parity test
    holds it to that); ``notes`` add what it does not say: the sizes, the limits and the
    five largest files inside and outside tests/files/."""

    def __init__(self, message: str, notes: list[str]) -> None:
        super().__init__(message)
        self.notes = notes


MIB = 1024 * 1024
LARGEST_SHOWN = 5


def human_bytes(size: int) -> str:
    """``size`` for a person: 512 bytes, 3.2 KiB, 25.0 MiB (the exact count stands beside it
    where a limit is at stake: 25.0 MiB may be a byte over 25 MiB)."""
    if size < 1024:
        return f"{size} bytes"
    if size < MIB:
        return f"{size / 1024:.1f} KiB"
    return f"{size / MIB:.1f} MiB"


def _left_out(rel: Path) -> bool:
    """Hidden files and caches, which neither packer uploads."""
    return (
        any(part.startswith(".") for part in rel.parts)
        or "__pycache__" in rel.as_posix()
        or rel.suffix == ".pyc"
    )


def _is_fixture(name: str) -> bool:
    return tuple(name.split("/")[:2]) == TEST_FILES_PREFIX


def survey(root: Path) -> dict[str, int]:
    """The upload set's files and their sizes as the file system says (no file is read):
    what a refusal over a limit lists. Links and anything else not a regular file are left
    out (packing refuses them on their own)."""
    sizes: dict[str, int] = {}
    candidates: list[Path] = []
    for dirname in PROJECT_DIRECTORIES:
        top = root / dirname
        if not top.is_symlink() and top.is_dir():
            candidates.extend(top.rglob("*"))
    candidates.append(root / REQUIREMENTS)
    for path in candidates:
        rel = path.relative_to(root)
        if _left_out(rel):
            continue
        try:
            info = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            sizes[rel.as_posix()] = info.st_size
    return sizes


def limit_notes(sizes: dict[str, int]) -> list[str]:
    """Lines that say how far over the limits ``sizes`` (a survey) are, and which files
    weigh most, inside and outside tests/files/, the largest first."""
    total = sum(sizes.values())
    code = sum(size for name, size in sizes.items() if not _is_fixture(name))
    lines = [
        f"All files: {human_bytes(total)} ({total:,} bytes); limit "
        f"{MAX_UPLOAD_SIZE // MIB} MiB ({MAX_UPLOAD_SIZE:,} bytes)",
        f"Outside tests/files/: {human_bytes(code)} ({code:,} bytes); limit "
        f"{MAX_CODE_SIZE // MIB} MiB ({MAX_CODE_SIZE:,} bytes)",
    ]
    for fixtures, where in ((True, "in tests/files/"), (False, "outside tests/files/")):
        chosen = sorted(
            ((size, name) for name, size in sizes.items() if _is_fixture(name) == fixtures),
            key=lambda item: (-item[0], item[1]),
        )[:LARGEST_SHOWN]
        lines.append(f"Largest {where}:" if chosen else f"Largest {where}: none")
        lines.extend(f"  {human_bytes(size):>10}  {name}" for size, name in chosen)
    return lines


@dataclass
class PackedProject:
    data: bytes
    files: list[str] = field(default_factory=list)

    @property
    def test_files(self) -> list[str]:
        return [f for f in self.files if f.split("/", 1)[0] == "tests"]


def _refuse(message: str) -> PackError:
    return PackError(f"File validation failed: {message}")


def _read_bounded(path: Path, limit: int) -> tuple[bytes, os.stat_result]:
    """At most ``limit + 1`` bytes of a regular file, opened without following a link."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"Project file is no longer a regular file: {path}")
        return stream.read(max(limit, 0) + 1), info


class _Collector:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.total = 0
        self.code = 0
        self.files: dict[str, tuple[bytes, os.stat_result]] = {}

    def _read(self, rel: Path, limit: int) -> bytes:
        try:
            data, info = _read_bounded(self.root / rel, limit)
        except OSError as exc:
            name = REQUIREMENTS if rel.as_posix() == REQUIREMENTS else rel
            raise _refuse(f"Could not read {name}: {exc}") from exc
        self.files[rel.as_posix()] = (data, info)
        return data

    def _over(self, exceeded: str) -> OverLimit:
        return OverLimit(str(_refuse(exceeded)), limit_notes(survey(self.root)))

    def _add_total(self, size: int) -> None:
        self.total += size
        if self.total > MAX_UPLOAD_SIZE:
            raise self._over(_TOTAL_EXCEEDED)

    def _add_code(self, size: int) -> None:
        self.code += size
        if self.code > MAX_CODE_SIZE:
            raise self._over(_CODE_EXCEEDED)

    def project_file(self, rel: Path) -> None:
        fixture = rel.parts[:2] == TEST_FILES_PREFIX
        limit = MAX_UPLOAD_SIZE - self.total
        if not fixture:
            limit = min(limit, MAX_CODE_SIZE - self.code)
        size = len(self._read(rel, limit))
        self._add_total(size)
        if fixture:
            return
        if rel.parts[:2] == TEST_BUILDERS_PREFIX:
            if rel.suffix != ".py":
                raise _refuse(f"{rel}: only .py files are allowed under tests/builders/")
        else:
            ext = rel.suffix.lower()
            if ext not in ALLOWED_EXTENSIONS:
                allowed = ", ".join(sorted(ALLOWED_EXTENSIONS))
                raise _refuse(f"{rel}: File type '{ext}' not allowed. Allowed: {allowed}")
        self._add_code(size)

    def walk(self) -> None:
        for dirname in PROJECT_DIRECTORIES:
            top = self.root / dirname
            if top.is_symlink():
                raise _refuse(f"Symbolic links are not allowed: {dirname}")
            if not top.exists():
                continue
            for path in sorted(top.rglob("*")):
                rel = path.relative_to(self.root)
                if _left_out(rel):
                    continue
                if path.is_symlink():
                    raise _refuse(f"Symbolic links are not allowed: {rel}")
                if path.is_file():
                    self.project_file(rel)
        requirements = self.root / REQUIREMENTS
        if requirements.is_symlink():
            raise _refuse(f"Symbolic links are not allowed: {REQUIREMENTS}")
        if requirements.exists():
            limit = min(MAX_UPLOAD_SIZE - self.total, MAX_CODE_SIZE - self.code)
            size = len(self._read(Path(REQUIREMENTS), limit))
            self._add_total(size)
            self._add_code(size)
        for name, (_, info) in self.files.items():
            if info.st_nlink > 1:
                raise _refuse(f"Hard links are not allowed: {name}")


def pack(root: Path) -> PackedProject:
    """The project's upload set as a reproducible .tar.gz; PackError names what is refused."""
    collector = _Collector(root)
    collector.walk()
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in sorted(collector.files):
            data, info = collector.files[name]
            member = tarfile.TarInfo(name)
            member.size = len(data)
            member.mode = info.st_mode & 0o7777
            tar.addfile(member, io.BytesIO(data))
    packed = buffer.getvalue()
    if len(packed) > MAX_UPLOAD_SIZE:
        raise OverLimit(
            f"Package size ({len(packed):,} bytes) exceeds {MAX_UPLOAD_SIZE:,} byte limit",
            limit_notes(survey(root)),
        )
    return PackedProject(data=packed, files=sorted(collector.files))


def pack_project(root: Path) -> bytes:
    """A .tar.gz of the project's upload set, paths relative to the project root."""
    return pack(root).data

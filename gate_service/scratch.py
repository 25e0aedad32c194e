"""Scratch directories for builds, owned by the process that holds their lock.

Every directory where a build stages its context (a bundle's test image, the runner image,
a pip download, a debootstrap root) is made by ``scratch_dir`` under
``GATE_DATA_DIR/scratch``, next to a lock file that its process holds (``flock``) for as
long as it works in it. The kernel drops that lock when the process dies, however it dies,
so ``clean_scratch`` can tell a directory a live job is still using (locked) from one a
crashed worker left behind (lock free), on any number of worker processes sharing the data
directory, and remove only the latter.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .config import Settings

log = logging.getLogger(__name__)

SCRATCH = "scratch"
LOCK_SUFFIX = ".lock"
# A directory is made a moment before its lock is taken: younger ones are left alone.
MIN_AGE_SECONDS = 60.0
# Scratch directories of versions before this module, made in GATE_DATA_DIR itself by
# tempfile (prefix, then 8 random characters) and never locked.
LEGACY = re.compile(r"^gate-(?:pip-|base-)?[a-z0-9_]{8}$")
LEGACY_MIN_AGE_SECONDS = 24 * 3600.0


def scratch_root(settings: Settings) -> Path:
    root = settings.runtime_dir() / SCRATCH
    root.mkdir(parents=True, exist_ok=True)
    return root


def _lock_path(directory: Path) -> Path:
    return directory.with_name(directory.name + LOCK_SUFFIX)


@contextmanager
def scratch_dir(settings: Settings, prefix: str) -> Iterator[Path]:
    """A new directory, locked by this process while the block runs, removed after it."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=scratch_root(settings)))
    fd = os.open(_lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
            try:
                _lock_path(path).unlink()
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)  # releases the lock


def _age(path: Path, now: float) -> float:
    try:
        return now - path.lstat().st_mtime
    except FileNotFoundError:
        return 0.0


def _owned(directory: Path) -> bool:
    """True while a live process holds the directory's lock."""
    try:
        fd = os.open(_lock_path(directory), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False  # never locked: its process died between mkdtemp and the lock
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def clean_scratch(settings: Settings, *, min_age_seconds: float = MIN_AGE_SECONDS) -> int:
    """Remove the scratch directories no live process owns; how many went."""
    root = scratch_root(settings)
    now = time.time()
    removed = 0
    for entry in sorted(root.iterdir()):
        if entry.name.endswith(LOCK_SUFFIX):
            directory = entry.with_name(entry.name[: -len(LOCK_SUFFIX)])
            # A lock whose directory is gone (removed a moment ago, or never made).
            if not directory.exists() and _age(entry, now) >= min_age_seconds:
                if not _owned(directory):
                    entry.unlink(missing_ok=True)
            continue
        if not entry.is_dir() or entry.is_symlink():
            continue
        if _age(entry, now) < min_age_seconds or _owned(entry):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        _lock_path(entry).unlink(missing_ok=True)
        removed += 1
        log.info("removed scratch directory %s (its worker is gone)", entry.name)
    data_dir = settings.runtime_dir()
    for entry in sorted(data_dir.iterdir()):
        if (
            LEGACY.match(entry.name)
            and entry.is_dir()
            and not entry.is_symlink()
            and _age(entry, now) >= LEGACY_MIN_AGE_SECONDS
        ):
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
            log.info("removed old scratch directory %s", entry.name)
    return removed

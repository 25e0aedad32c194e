"""Property: whatever the archive, reading it raises only our errors and writes nothing
outside the fresh destination directory."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate_service.bundles.archive import read_archive
from gate_service.errors import GateError

CANARY = f"gate-hypothesis-canary-{os.getpid()}"
SEGMENTS = st.sampled_from(
    [
        "agents",
        "tools",
        "tests",
        "files",
        "builders",
        "a.py",
        "b.yaml",
        "x.txt",
        "..",
        ".",
        "",
        "C:",
        "\\",
        "..\\..",
        f"/tmp/{CANARY}",
        "__pycache__",
        ".hidden",
        "\u00e9t\u00e9",
        "n" * 300,
    ]
)
NAMES = st.lists(SEGMENTS, min_size=1, max_size=6).map("/".join)
KINDS = st.sampled_from(["file", "file", "file", "dir", "symlink", "hardlink", "fifo", "chr"])
MEMBERS = st.lists(st.tuples(NAMES, KINDS, st.binary(max_size=64), NAMES), min_size=1, max_size=12)


def build_tar(members: list[tuple[str, str, bytes, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, data, target in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
                "chr": tarfile.CHRTYPE,
            }[kind]
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def build_zip(members: list[tuple[str, str, bytes, str]]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(buf, "w") as zf:
            for name, kind, data, target in members:
                info = zipfile.ZipInfo(name or "x")
                if kind == "symlink":
                    info.external_attr = 0o120777 << 16
                    data = target.encode()
                elif kind == "dir":
                    info.external_attr = 0o040755 << 16
                zf.writestr(info, data)
    return buf.getvalue()


def files_under(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def check(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dest = root / "bundle"
        try:
            read_archive(data, dest)
        except GateError:
            pass
        outside = {p for p in files_under(root) if dest not in p.parents and p != dest}
        assert outside == set()
        for path in files_under(dest):
            assert not path.is_symlink()
            assert path.resolve().is_relative_to(dest.resolve())
    assert not Path(f"/tmp/{CANARY}").exists()


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MEMBERS)
def test_random_tar_archives_stay_inside_the_destination(
    members: list[tuple[str, str, bytes, str]],
) -> None:
    check(build_tar(members))


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MEMBERS)
def test_random_zip_archives_stay_inside_the_destination(
    members: list[tuple[str, str, bytes, str]],
) -> None:
    check(build_zip(members))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(MEMBERS, st.data())
def test_corrupted_archives_raise_only_gate_errors(
    members: list[tuple[str, str, bytes, str]], data: st.DataObject
) -> None:
    raw = bytearray(data.draw(st.sampled_from([build_tar, build_zip]))(members))
    for _ in range(data.draw(st.integers(0, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(raw)))
    check(bytes(raw[:cut]))

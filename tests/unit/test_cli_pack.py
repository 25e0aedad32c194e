"""`gate submit DIR` packs the upload set exactly as the format's own CLI does (spec §1, §9.2)."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from connic import cli as connic_cli

from gate_service.client import pack as gate_pack
from gate_service.client.api import pack_project as reexported
from gate_service.client.pack import PackError, pack, pack_project
from tests.fixtures.projects import (
    builder_project,
    calculator_project,
    llm_project,
    mock_project,
    requirements_project,
    write,
)


def members(data: bytes) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for info in tar.getmembers():
            assert info.isreg(), info.name
            handle = tar.extractfile(info)
            assert handle is not None
            out[info.name] = handle.read()
    return out


@pytest.fixture
def in_dir() -> Iterator[None]:
    here = os.getcwd()
    yield
    os.chdir(here)


def format_pack(root: Path) -> bytes:
    """The format CLI's packer, which works on the current directory."""
    os.chdir(root)
    data, _ = connic_cli._package_project_files()
    return bytes(data)


def format_refusal(root: Path) -> str:
    os.chdir(root)
    with pytest.raises(ValueError, match="File validation failed") as refused:
        connic_cli._package_project_files()
    return str(refused.value)


def with_extras(root: Path) -> Path:
    """What a real checkout also holds: caches, hidden files, files outside the upload set,
    fixtures of any type, a connectors/ folder, requirements.txt."""
    write(
        root,
        {
            "tools/__pycache__/math_ops.cpython-311.pyc": "x",
            "tools/.hidden.py": "x",
            ".git/config": "x",
            "README.md": "not uploaded",
            "setup.cfg": "not uploaded",
            "tests/files/photo.bin": "binary-ish",
            "tests/files/nested/data.xyz": "any extension",
            "tests/builders/make.py": "def build(context):\n    return None\n",
            "connectors/feed.yaml": "name: feed\n",
            "requirements.txt": "requests==2.0\n",
            "schemas/Answer.JSON": "{}",
        },
    )
    (root / "tests/files/raw.dat").write_bytes(bytes(range(256)))
    return root


PROJECTS: dict[str, Callable[[Path], Path]] = {
    "calculator": lambda p: with_extras(calculator_project(p, failing=True)),
    "llm": llm_project,
    "mocks": mock_project,
    "builders": builder_project,
    "requirements": lambda p: requirements_project(p, "gate-e2e-demo==1.0\n"),
}


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_same_members_and_contents_as_the_format_cli(
    name: str, tmp_path: Path, in_dir: None
) -> None:
    root = PROJECTS[name](tmp_path / name)
    ours = members(pack_project(root))
    theirs = members(format_pack(root))
    assert sorted(ours) == sorted(theirs)
    assert ours == theirs
    assert ours  # the comparison saw files


def test_the_constants_are_the_format_clis() -> None:
    assert gate_pack.PROJECT_DIRECTORIES == connic_cli.PROJECT_DIRECTORIES
    assert gate_pack.ALLOWED_EXTENSIONS == connic_cli.ALLOWED_EXTENSIONS
    assert gate_pack.MAX_UPLOAD_SIZE == connic_cli.MAX_UPLOAD_SIZE
    assert gate_pack.MAX_CODE_SIZE == connic_cli.MAX_CODE_SIZE


def test_the_archive_is_reproducible(tmp_path: Path) -> None:
    root = calculator_project(tmp_path / "p", failing=False)
    first = pack_project(root)
    os.utime(root / "tools/math_ops.py", (1, 1))
    assert pack_project(root) == first  # same files, same bytes, same bundle sha256
    (root / "tools/math_ops.py").write_text("changed = True\n")
    assert pack_project(root) != first


def test_the_old_import_path_still_packs() -> None:
    assert reexported is pack_project


def test_exec_bits_survive(tmp_path: Path) -> None:
    root = calculator_project(tmp_path / "p", failing=False)
    (root / "tools/math_ops.py").chmod(0o755)
    with tarfile.open(fileobj=io.BytesIO(pack_project(root)), mode="r:gz") as tar:
        assert tar.getmember("tools/math_ops.py").mode == 0o755
        assert tar.getmember("tools/math_ops.py").uid == 0


def _big(root: Path, rel: str, size: int) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"a" * size)


REFUSALS: dict[str, tuple[Callable[[Path], object], str]] = {
    "an extension outside tests/files": (
        lambda r: write(r, {"tools/binary.exe": "MZ"}),
        "tools/binary.exe: File type '.exe' not allowed.",
    ),
    "a builder that is not python": (
        lambda r: write(r, {"tests/builders/make.yaml": "x: 1"}),
        "tests/builders/make.yaml: only .py files are allowed under tests/builders/",
    ),
    "code over 5 MB": (
        lambda r: _big(r, "tools/huge.py", gate_pack.MAX_CODE_SIZE + 1),
        "Code/config size exceeds 5,242,880 byte limit. Move large fixtures into tests/files/.",
    ),
    "fixtures over 25 MB": (
        lambda r: _big(r, "tests/files/huge.bin", gate_pack.MAX_UPLOAD_SIZE + 1),
        "Total file size exceeds 26,214,400 byte limit",
    ),
    "a symbolic link": (
        lambda r: (r / "tools/link.py").symlink_to(r / "tools/math_ops.py"),
        "Symbolic links are not allowed: tools/link.py",
    ),
    "a linked folder": (
        lambda r: (r / "hooks").symlink_to(r / "tools", target_is_directory=True),
        "Symbolic links are not allowed: hooks",
    ),
    "a hard link": (
        lambda r: os.link(r / "tools/math_ops.py", r / "tests/copy.py"),
        "Hard links are not allowed: ",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_say_what_the_format_cli_says(case: str, tmp_path: Path, in_dir: None) -> None:
    make, expected = REFUSALS[case]
    root = calculator_project(tmp_path / "p", failing=False)
    make(root)
    with pytest.raises(PackError) as ours:
        pack(root)
    assert expected in str(ours.value)
    assert str(ours.value).startswith("File validation failed: ")
    theirs = format_refusal(root)
    if case == "a hard link":  # either name of the linked pair may be the one reported
        assert theirs.startswith("File validation failed: Hard links are not allowed: ")
    else:
        assert str(ours.value) == theirs


def test_fixtures_may_fill_what_code_may_not(tmp_path: Path) -> None:
    root = calculator_project(tmp_path / "p", failing=False)
    _big(root, "tests/files/big.bin", gate_pack.MAX_CODE_SIZE + 10)
    packed = pack(root)
    assert "tests/files/big.bin" in packed.files
    assert packed.test_files and all(f.startswith("tests/") for f in packed.test_files)

"""Over a size limit, both packers name the culprit: `gate submit`'s local refusal adds the
sizes, the limits and the five largest files inside and outside tests/files/ to the format
CLI's message (kept word for word), and the service's refusal names what it read.

Big files are sparse (``truncate``): their size is real, their blocks are not written.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from gate_service.bundles.archive import TOTAL_LIMIT_BYTES, human_bytes, read_archive
from gate_service.client import pack as pack_module
from gate_service.client.pack import OverLimit, PackError, limit_notes, pack
from gate_service.errors import PayloadTooLarge
from tests.fixtures.projects import calculator_project

KIB, MIB = 1024, 1024 * 1024


def sparse(root: Path, rel: str, size: int) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(size)


def upload_set_bytes(root: Path) -> int:
    """Every file of the fixture project is in the upload set (no hidden files, no caches)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_code_over_5_mib_keeps_the_format_clis_message_and_names_the_largest_files(
    tmp_path: Path,
) -> None:
    root = calculator_project(tmp_path / "p", failing=False)
    code = {f"tools/gen_{i}.py": (1500 - 100 * i) * KIB for i in range(6)}  # 6 files, 7.3 MiB
    fixtures = {f"tests/files/set_{i}.csv": (6 - i) * 100 * KIB for i in range(6)}
    for rel, size in {**code, **fixtures}.items():
        sparse(root, rel, size)

    with pytest.raises(OverLimit) as refused:
        pack(root)

    assert isinstance(refused.value, PackError)  # what callers already catch
    assert str(refused.value) == (
        "File validation failed: Code/config size exceeds 5,242,880 byte limit. "
        "Move large fixtures into tests/files/."
    )
    notes = refused.value.notes
    total = upload_set_bytes(root)
    outside = total - sum(fixtures.values())
    assert (
        notes[0]
        == f"All files: {human_bytes(total)} ({total:,} bytes); limit 25 MiB (26,214,400 bytes)"
    )
    assert notes[1] == (
        f"Outside tests/files/: {human_bytes(outside)} ({outside:,} bytes); "
        "limit 5 MiB (5,242,880 bytes)"
    )
    inside_at, outside_at = (
        notes.index("Largest in tests/files/:"),
        notes.index("Largest outside tests/files/:"),
    )
    # Five of each, the largest first; the sixth of each is left out.
    assert notes[inside_at + 1 : outside_at] == [
        f"  {human_bytes(size):>10}  {rel}" for rel, size in list(fixtures.items())[:5]
    ]
    assert notes[outside_at + 1 :] == [
        f"  {human_bytes(size):>10}  {rel}" for rel, size in list(code.items())[:5]
    ]
    assert "tools/gen_5.py" not in "\n".join(notes)
    assert "tests/files/set_5.csv" not in "\n".join(notes)
    assert notes[outside_at + 1] == "     1.5 MiB  tools/gen_0.py"


def test_the_listing_leaves_out_what_is_not_uploaded_and_says_none(tmp_path: Path) -> None:
    root = calculator_project(tmp_path / "p", failing=False)
    sparse(root, "tools/.cache/huge.py", 50 * MIB)  # hidden: neither packer uploads it
    sparse(root, "docs/manual.md", 50 * MIB)  # not a project folder
    sparse(root, "tools/__pycache__/x.pyc", 50 * MIB)
    notes = limit_notes(pack_module.survey(root))
    assert "Largest in tests/files/: none" in notes
    shown = "\n".join(notes)
    assert "huge.py" not in shown and "manual.md" not in shown and "x.pyc" not in shown
    total = upload_set_bytes(root) - 150 * MIB
    assert notes[0].startswith(f"All files: {human_bytes(total)} ({total:,} bytes)")


def test_a_file_that_crosses_the_total_is_sized_by_the_file_system_not_by_what_was_read(
    tmp_path: Path,
) -> None:
    # Packing stops reading at the limit; the listing still says how big each file is.
    root = calculator_project(tmp_path / "p", failing=False)
    sparse(root, "tests/files/disk.img", 40 * MIB)
    with pytest.raises(OverLimit) as refused:
        pack(root)
    assert (
        str(refused.value)
        == "File validation failed: Total file size exceeds 26,214,400 byte limit"
    )
    assert "    40.0 MiB  tests/files/disk.img" in refused.value.notes


@pytest.mark.parametrize(
    ("size", "shown"),
    [(0, "0 bytes"), (1023, "1023 bytes"), (1024, "1.0 KiB"), (5 * MIB, "5.0 MiB"),
     (TOTAL_LIMIT_BYTES + 1, "25.0 MiB")],
)  # fmt: skip
def test_sizes_for_a_person(size: int, shown: str) -> None:
    assert human_bytes(size) == shown
    assert pack_module.human_bytes(size) == shown  # the client's twin (it imports no service)


def _tgz(files: dict[str, int]) -> bytes:
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        for name, size in files.items():
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    return buf.getvalue()


def test_the_services_refusal_names_the_limit_what_it_read_and_the_largest_files() -> None:
    data = _tgz(
        {"agents/a.yaml": 10, "tests/files/a.bin": 12 * MIB, "tests/files/b.bin": 10 * MIB,
         "tools/c.py": 2 * MIB, "tests/files/d.bin": 8 * MIB, "tests/files/never.bin": MIB}
    )  # fmt: skip
    with pytest.raises(PayloadTooLarge) as refused:
        read_archive(data)
    detail = refused.value.detail
    # Reading stopped inside d.bin: the count is what was read by then, and said to be that.
    read = refused.value.problems[0]["measured_bytes"]
    assert TOTAL_LIMIT_BYTES < read < TOTAL_LIMIT_BYTES + MIB
    assert detail.startswith(
        "the bundle's files total more than 26214400 bytes (25 MiB) uncompressed: "
        f"reading stopped after {read:,} bytes ({human_bytes(read)}); the largest files read: "
        "tests/files/a.bin (12.0 MiB), tests/files/b.bin (10.0 MiB), tools/c.py (2.0 MiB), "
        "tests/files/d.bin ("
    ), detail
    assert detail.endswith(", agents/a.yaml (10 bytes)"), detail
    assert "never.bin" not in detail  # never read: not claimed


def test_the_services_code_refusal_names_the_largest_files_outside_tests_files() -> None:
    data = _tgz({"tests/files/big.bin": 9 * MIB, "tools/a.py": 3 * MIB, "tools/b.py": 3 * MIB})
    with pytest.raises(PayloadTooLarge) as refused:
        read_archive(data)
    detail = refused.value.detail
    read = refused.value.problems[0]["measured_bytes"]
    assert detail.startswith(
        "files outside tests/files/ total more than 5242880 bytes (5 MiB): "
        f"reading stopped after {read:,} bytes of them ({human_bytes(read)}); "
        "the largest read outside tests/files/: tools/a.py (3.0 MiB), tools/b.py ("
    ), detail
    assert "big.bin" not in detail

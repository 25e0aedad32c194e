"""Reading untrusted archives: what is kept, what is skipped, what is refused."""

from __future__ import annotations

import gzip
import io
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from gate_service.bundles.archive import CODE_LIMIT_BYTES, TOTAL_LIMIT_BYTES, read_archive
from gate_service.errors import PayloadTooLarge, UnsafeArchive, UnsupportedMediaType


def tgz(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def reg(name: str, data: bytes = b"x = 1\n") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def special(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def zipped(**files: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def test_extracts_the_upload_set_and_counts_bytes(tmp_path: Path) -> None:
    data = tgz(
        reg("agents/a.yaml", b"name: a\n"),
        reg("connectors/c.yaml", b"k: v\n"),
        reg("tests/files/blob.bin", b"\x00" * 100),
        reg("requirements.txt", b"pyyaml\n"),
        reg("README.md", b"not uploaded"),
        reg("tools/__pycache__/x.pyc", b"cache"),
        reg(".env", b"SECRET=1"),
    )
    manifest = read_archive(data, tmp_path)
    assert sorted(manifest.files) == [
        "agents/a.yaml", "connectors/c.yaml", "requirements.txt", "tests/files/blob.bin",
    ]  # fmt: skip
    assert (manifest.code_bytes, manifest.fixture_bytes) == (20, 100)
    assert (tmp_path / "tests/files/blob.bin").read_bytes() == b"\x00" * 100
    assert not (tmp_path / ".env").exists()
    assert not (tmp_path / "README.md").exists()


def test_dot_slash_archives_from_tar_c_dir_dot(tmp_path: Path) -> None:
    dot = tarfile.TarInfo("./")
    dot.type = tarfile.DIRTYPE
    data = tgz((dot, None), reg("./agents/a.yaml"))
    assert list(read_archive(data, tmp_path).files) == ["agents/a.yaml"]


def test_a_single_wrapping_folder_is_seen_through(tmp_path: Path) -> None:
    data = tgz(reg("myproj/agents/a.yaml"), reg("myproj/tools/t.py"))
    assert sorted(read_archive(data, tmp_path).files) == ["agents/a.yaml", "tools/t.py"]


@pytest.mark.parametrize(
    ("member", "fragment"),
    [
        (reg("../evil.py"), "contains '..'"),
        (reg("agents/../../evil.py"), "contains '..'"),
        (reg("/etc/passwd"), "absolute path"),
        (reg("C:/evil.py"), "absolute path"),
        (reg("agents\\evil.py"), "backslash"),
        (special("agents/link.yaml", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link"),
        (special("agents/hard.yaml", tarfile.LNKTYPE, "/etc/passwd"), "hard link"),
        (special("agents/dev", tarfile.CHRTYPE), "device node"),
        (special("agents/fifo", tarfile.FIFOTYPE), "FIFO"),
        (reg("a/" * 40 + "x.py"), "levels deep"),
    ],
)
def test_hostile_tar_entries_are_refused(
    member: tuple[tarfile.TarInfo, bytes | None], fragment: str, tmp_path: Path
) -> None:
    with pytest.raises(UnsafeArchive, match=fragment):
        read_archive(tgz(reg("agents/a.yaml"), member), tmp_path / "out")
    assert not (tmp_path / "evil.py").exists()


def test_duplicate_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeArchive, match="more than once"):
        read_archive(tgz(reg("agents/a.yaml"), reg("agents/a.yaml")), tmp_path)


def test_zip_slip_and_zip_symlinks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeArchive, match=r"contains '\.\.'"):
        read_archive(zipped(**{"../../evil.py": b"x"}), tmp_path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo("agents/link.yaml")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchive, match="symbolic link"):
        read_archive(buf.getvalue(), tmp_path)


def test_a_gzip_bomb_is_stopped_at_the_limit_without_writing_it(tmp_path: Path) -> None:
    # ~1 GiB of zeros would compress to about 1 MiB; 40 MiB is enough to cross the limit.
    data = tgz(reg("tests/files/zeros.bin", b"\x00" * (TOTAL_LIMIT_BYTES + CODE_LIMIT_BYTES)))
    assert len(data) < 200_000
    with pytest.raises(PayloadTooLarge) as info:
        read_archive(data, tmp_path)
    assert "26214400" in info.value.detail
    written = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert written <= TOTAL_LIMIT_BYTES


def test_code_over_five_mib_is_refused_with_the_largest_files(tmp_path: Path) -> None:
    big = b"#" * (CODE_LIMIT_BYTES + 1)
    with pytest.raises(PayloadTooLarge) as info:
        read_archive(tgz(reg("tools/big.py", big)), tmp_path)
    assert "5 MiB" in info.value.detail
    assert info.value.problems[0]["largest"][0]["path"] == "tools/big.py"


def test_disallowed_extensions_are_all_listed(tmp_path: Path) -> None:
    data = tgz(
        reg("tools/x.sh"),
        reg("agents/y.exe"),
        reg("tests/builders/b.yaml"),
        reg("tests/files/ok.exe"),
    )
    with pytest.raises(UnsafeArchive) as info:
        read_archive(data, tmp_path)
    files = sorted(p["file"] for p in info.value.problems)
    assert files == ["agents/y.exe", "tests/builders/b.yaml", "tools/x.sh"]


def test_not_an_archive_and_truncated_gzip(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedMediaType):
        read_archive(b"hello world", tmp_path)
    good = tgz(reg("agents/a.yaml", b"x" * 100_000))
    with pytest.raises(UnsafeArchive, match="truncated or corrupt"):
        read_archive(good[: len(good) // 2], tmp_path)
    with pytest.raises(UnsafeArchive):
        read_archive(gzip.compress(b"not a tar at all" * 100), tmp_path)


def test_a_tar_gz_in_a_file_reads_and_extracts_as_its_bytes(tmp_path: Path) -> None:
    data = tgz(reg("agents/a.yaml", b"name: a\n"), reg("tests/files/big.bin", b"\0" * 200_000))
    with tempfile.SpooledTemporaryFile(max_size=1024) as file:
        file.write(data)
        manifest = read_archive(file, tmp_path / "from-file")
    assert manifest == read_archive(data, tmp_path / "from-bytes")
    assert (tmp_path / "from-file" / "tests/files/big.bin").read_bytes() == b"\0" * 200_000

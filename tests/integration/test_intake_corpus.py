"""A corpus of hostile and broken uploads: each is refused with the exact status and a reason
that names the problem, nothing is queued, and nothing ever answers 500."""

from __future__ import annotations

import io
import os
import tarfile
import warnings
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gate_service.models import Gate

MIB = 1024 * 1024
GOOD = b'version: "1.0"\nname: a\ndescription: a\ntype: tool\ntool_name: t.f\n'


def tar_bytes(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for info, data in members:
            if data is None:
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def f(name: str, data: bytes = GOOD) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def link(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def folder(name: str) -> tuple[tarfile.TarInfo, None]:
    return link(name, tarfile.DIRTYPE)


def zip_bytes(*entries: tuple[str | zipfile.ZipInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicates we want to write
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in entries:
                zf.writestr(name, data)
    return buf.getvalue()


def zip_info(name: str, *, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = mode << 16
    return info


def gzip_of_zeros_tar(name: str, size: int) -> bytes:
    """A tar.gz holding ``size`` zero bytes, compressed in a stream (1 GiB ~ 1 MiB)."""
    header = tarfile.TarInfo(name)
    header.size = size
    raw_header = header.tobuf(format=tarfile.GNU_FORMAT)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [comp.compress(raw_header)]
    block = b"\x00" * MIB
    for _ in range(size // MIB):
        out.append(comp.compress(block))
    out.append(comp.compress(b"\x00" * (-size % 512 + 1024)))
    out.append(comp.flush())
    return b"".join(out)


def zip_of_zeros(name: str, size: int) -> bytes:
    buf = io.BytesIO()
    with (
        zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf,
        zf.open(name, "w", force_zip64=True) as fh,
    ):
        block = b"\x00" * MIB
        for _ in range(size // MIB):
            fh.write(block)
    return buf.getvalue()


def encrypted_zip() -> bytes:
    """Python cannot write encrypted zips; set the 'encrypted' flag bit in both headers."""
    data = bytearray(zip_bytes(("agents/a.yaml", GOOD)))
    data[6] |= 0x1  # local file header: general purpose flags at offset 6
    central = data.find(b"PK\x01\x02")
    data[central + 8] |= 0x1  # central directory header: flags at offset 8
    return bytes(data)


def pax(headers: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("agents/a.yaml")
        info.size, info.pax_headers = len(GOOD), headers
        tar.addfile(info, io.BytesIO(GOOD))
    return buf.getvalue()


def zip_with_method(method: int) -> bytes:
    """Deflate64 (9) and the like: zipfile cannot write them, so patch the headers."""
    data = bytearray(zip_bytes(("agents/a.yaml", GOOD)))
    data[8:10] = method.to_bytes(2, "little")  # local header: compression method
    central = data.find(b"PK\x01\x02")
    data[central + 10 : central + 12] = method.to_bytes(2, "little")
    return bytes(data)


def raw_name_tar(name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", encoding="utf-8", errors="surrogateescape") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(GOOD)
        tar.addfile(info, io.BytesIO(GOOD))
    return buf.getvalue()


def macos_zip(with_project: bool) -> bytes:
    entries = [("__MACOSX/proj/._agents", b"\x00\x05"), ("proj/.DS_Store", b"x")]
    if with_project:
        entries += [("proj/agents/a.yaml", GOOD), ("proj/tests/a.yaml", b"tests: []")]
    else:
        entries += [("proj/README.md", b"hello")]
    return zip_bytes(*entries)


def truncated() -> bytes:
    good = tar_bytes(f("agents/a.yaml", os.urandom(200_000)))
    return good[: len(good) // 2]


def many_files(n: int) -> bytes:
    return tar_bytes(*(f(f"tests/files/f{i}.txt", b"x") for i in range(n)))


@dataclass(frozen=True)
class Case:
    build: Callable[[], bytes]
    status: int
    fragment: str
    filename: str = "bundle.tar.gz"


CORPUS: dict[str, Case] = {
    "zip_slip_dotdot": Case(
        lambda: zip_bytes(("../../evil.py", b"x")), 422, "contains '..'", "b.zip"
    ),
    "zip_absolute_path": Case(
        lambda: zip_bytes(("/etc/cron.d/evil", b"x")), 422, "absolute path", "b.zip"
    ),
    "zip_drive_letter": Case(
        lambda: zip_bytes(("C:/evil.py", b"x")), 422, "absolute path", "b.zip"
    ),
    "zip_backslash_traversal": Case(
        lambda: zip_bytes(("agents\\..\\..\\evil.py", b"x")), 422, "backslash", "b.zip"
    ),
    "zip_symlink": Case(
        lambda: zip_bytes((zip_info("agents/a.yaml", mode=0o120777), b"/etc/passwd")),
        422,
        "symbolic link",
        "b.zip",
    ),
    "zip_encrypted_entry": Case(encrypted_zip, 422, "encrypted entry", "b.zip"),
    "zip_duplicate_names": Case(
        lambda: zip_bytes(("agents/a.yaml", GOOD), ("agents/a.yaml", b"evil")),
        422,
        "more than once",
        "b.zip",
    ),
    "zip_bomb_1_gib": Case(
        lambda: zip_of_zeros("tests/files/zeros.bin", 1024 * MIB), 413, "26214400", "b.zip"
    ),
    "tar_symlink_escape": Case(
        lambda: tar_bytes(link("agents/a.yaml", tarfile.SYMTYPE, "../../../etc/passwd")),
        422,
        "symbolic link",
    ),
    "tar_symlinked_folder_then_write_through": Case(
        lambda: tar_bytes(link("tools", tarfile.SYMTYPE, "/tmp"), f("tools/evil.py")),
        422,
        "symbolic link",
    ),
    "tar_hard_link": Case(
        lambda: tar_bytes(
            f("agents/a.yaml"), link("agents/b.yaml", tarfile.LNKTYPE, "/etc/shadow")
        ),
        422,
        "hard link",
    ),
    "tar_char_device": Case(
        lambda: tar_bytes(link("agents/null", tarfile.CHRTYPE)), 422, "device node"
    ),
    "tar_block_device": Case(
        lambda: tar_bytes(link("agents/sda", tarfile.BLKTYPE)), 422, "device node"
    ),
    "tar_fifo": Case(lambda: tar_bytes(link("agents/pipe", tarfile.FIFOTYPE)), 422, "FIFO"),
    "tar_absolute_path": Case(lambda: tar_bytes(f("/etc/evil.yaml")), 422, "absolute path"),
    "tar_dotdot": Case(lambda: tar_bytes(f("agents/../../evil.yaml")), 422, "contains '..'"),
    "tar_duplicate_names": Case(
        lambda: tar_bytes(f("agents/a.yaml"), f("agents/a.yaml", b"evil")), 422, "more than once"
    ),
    "tar_file_then_folder_of_same_name": Case(
        lambda: tar_bytes(f("tools/a.py"), f("tools/a.py/b.py")), 422, "a file"
    ),
    "tar_folder_then_file_of_same_name": Case(
        lambda: tar_bytes(folder("tools/x.py"), f("tools/x.py")), 422, "more than once"
    ),
    "tar_too_deep": Case(
        lambda: tar_bytes(f("tests/files/" + "d/" * 40 + "x.txt")), 422, "levels deep"
    ),
    "tar_name_component_too_long": Case(
        lambda: tar_bytes(f("tests/files/" + "n" * 300)), 422, "exceeds 255 characters"
    ),
    "total_25_mib_plus_1": Case(
        lambda: tar_bytes(f("tests/files/big.bin", b"\x00" * (25 * MIB + 1))), 413, "26214400"
    ),
    "code_5_mib_plus_1_total_under_budget": Case(
        lambda: tar_bytes(f("tools/big.py", b"#" * (5 * MIB + 1))), 413, "5 MiB"
    ),
    "twenty_thousand_tiny_files": Case(lambda: many_files(20_000), 422, "the limit is 10000"),
    "gzip_bomb_1_gib": Case(
        lambda: gzip_of_zeros_tar("tests/files/zeros.bin", 1024 * MIB), 413, "26214400"
    ),
    "compressed_upload_over_25_mib": Case(
        lambda: tar_bytes(f("tests/files/noise.bin", os.urandom(26 * MIB))), 413, "upload limit"
    ),
    "not_an_archive": Case(lambda: b"#!/bin/sh\nrm -rf /\n", 415, "neither a gzip-compressed tar"),
    "truncated_gzip": Case(truncated, 422, "truncated or corrupt"),
    "gzip_that_is_not_a_tar": Case(lambda: zlib.compress(b"hello" * 1000, wbits=31), 422, "tar"),
    "zip_missing_central_directory": Case(
        lambda: b"PK\x03\x04" + b"\x00" * 100, 422, "not a readable .zip", "b.zip"
    ),
    "shell_script_outside_tests_files": Case(
        lambda: tar_bytes(f("tools/run.sh", b"echo")), 422, "not allowed outside tests/files/"
    ),
    "builder_that_is_not_python": Case(
        lambda: tar_bytes(f("tests/builders/b.yaml", b"x: 1")), 422, "builders must be .py"
    ),
    "empty_file": Case(lambda: b"", 400, "empty"),
    "tar_pax_sparse_map_garbage": Case(
        lambda: pax({"GNU.sparse.map": "abc"}), 422, "not a readable .tar.gz"
    ),
    "tar_pax_header_of_four_megabytes": Case(
        lambda: pax({"GNU.sparse.map": ",".join(["0"] * 2_000_000)}), 422, "extended header"
    ),
    "zip_deflate64_entry": Case(
        lambda: zip_with_method(9), 422, "compressed with method 9", "b.zip"
    ),
    "tar_name_not_utf8": Case(lambda: raw_name_tar("agents/\udcff.yaml"), 422, "not valid UTF-8"),
    "tar_name_with_control_character": Case(
        lambda: raw_name_tar("agents/a\x07.yaml"), 422, "control characters"
    ),
    "tar_name_over_255_bytes_in_utf8": Case(
        lambda: raw_name_tar("agents/" + "\u65e5" * 200 + ".py"), 422, "exceeds 255"
    ),
    "zip_with_nothing_in_the_upload_set": Case(
        lambda: macos_zip(False), 422, "holds none of agents/", "b.zip"
    ),
}


def gate_count(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(Gate)) or 0


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_upload_is_refused(
    name: str, client: TestClient, sessions: sessionmaker[Session]
) -> None:
    case = CORPUS[name]
    response = client.post("/v1/gates", files={"bundle": (case.filename, case.build())})
    assert response.status_code == case.status, response.text
    body = response.json()
    assert set(body) == {"error", "detail", "problems"}
    assert case.fragment in body["detail"], body
    assert gate_count(sessions) == 0


def test_over_limit_bodies_name_the_largest_files(client: TestClient) -> None:
    data = tar_bytes(f("tools/big.py", b"#" * (5 * MIB + 1)), f("tools/small.py", b"x"))
    body = client.post("/v1/gates", files={"bundle": ("b.tgz", data)}).json()
    problem = body["problems"][0]
    assert problem["limit_bytes"] == 5 * MIB
    assert problem["measured_bytes"] > 5 * MIB
    assert problem["largest"][0] == {"path": "tools/big.py", "bytes": 5 * MIB + 1}


def test_zip_sent_with_a_tar_name_is_judged_by_its_content(client: TestClient) -> None:
    data = zip_bytes(("agents/a.yaml", GOOD), ("tests/a.yaml", b"tests: []"))
    response = client.post("/v1/gates", files={"bundle": ("bundle.tar.gz", data)})
    assert response.status_code == 202, response.text


def test_wrong_content_type_and_malformed_multipart(client: TestClient) -> None:
    assert client.post("/v1/gates", json={"bundle": "x"}).status_code == 415
    response = client.post(
        "/v1/gates",
        content=b"--x\r\nnot a header line at all",
        headers={"Content-Type": "multipart/form-data; boundary=x"},
    )
    assert response.status_code in (400, 422)
    assert response.json()["error"] in ("BadRequest", "RequestInvalid")


def test_two_bundle_fields_are_refused(client: TestClient) -> None:
    good = tar_bytes(f("agents/a.yaml"))
    response = client.post(
        "/v1/gates", files=[("bundle", ("a.tgz", good)), ("bundle", ("b.tgz", good))]
    )
    assert response.status_code == 400
    assert "more than one 'bundle'" in response.json()["detail"]


def test_a_macos_finder_zip_is_seen_through(client: TestClient) -> None:
    response = client.post("/v1/gates", files={"bundle": ("proj.zip", macos_zip(True))})
    assert response.status_code == 202, response.text
    assert response.json()["bundle"]["code_bytes"] == len(GOOD) + len(b"tests: []")


def test_nul_in_form_fields_is_a_400(client: TestClient) -> None:
    good = tar_bytes(f("agents/a.yaml"))
    for data in ({"filter": "a\x00b"}, {"labels": '{"k": "\\u0000"}'}):
        response = client.post("/v1/gates", files={"bundle": ("b.tgz", good)}, data=data)
        assert response.status_code == 400, response.text
        assert "NUL" in response.json()["detail"]


def test_undecodable_content_type_is_a_415(client: TestClient) -> None:
    response = client.post("/v1/gates", content=b"x", headers={"Content-Type": b"text/\xe9"})
    assert response.status_code == 415

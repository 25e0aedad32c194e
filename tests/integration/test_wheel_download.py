"""Fetching a bundle's wheels with the real pip: wheels only, in time, within a byte budget.

These call gate_service.bundles.wheels, which the worker calls before a build: no engine.
"""

from __future__ import annotations

import http.server
import io
import tarfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gate_service.bundles.wheels import WheelDownloadError, fetch_wheels
from gate_service.config import Settings
from tests.fixtures.projects import make_wheel


def evil_sdist(wheelhouse: Path, marker: Path) -> Path:
    """An sdist-only package whose setup.py leaves a marker if pip ever runs it."""
    setup = textwrap.dedent(
        f"""
        open({str(marker)!r}, "w").write("setup.py ran on the host")
        from setuptools import setup
        setup(name="evil", version="1.0")
        """
    ).encode()
    pkg_info = b"Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    path = wheelhouse / "evil-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, body in (("setup.py", setup), ("PKG-INFO", pkg_info)):
            info = tarfile.TarInfo(f"evil-1.0/{name}")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


def offline(tmp_path: Path, wheelhouse: Path, **limits: float) -> Settings:
    return Settings(
        wheelhouse_dir=wheelhouse, pip_offline=True, data_dir=tmp_path / "data", **limits
    )


def test_a_package_with_only_an_sdist_is_refused_and_never_built(tmp_path: Path) -> None:
    wheelhouse, marker = tmp_path / "wheelhouse", tmp_path / "marker"
    evil_sdist(wheelhouse, marker)
    with pytest.raises(WheelDownloadError, match="no wheel for evil"):
        fetch_wheels(offline(tmp_path, wheelhouse), ["evil==1.0"], tmp_path / "wheels")
    assert not marker.exists()


def test_wheels_are_fetched_from_the_wheelhouse(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse)
    dest = tmp_path / "wheels"
    fetch_wheels(offline(tmp_path, wheelhouse), ["gate-e2e-demo==1.0"], dest)
    assert [p.name for p in dest.iterdir()] == ["gate_e2e_demo-1.0-py3-none-any.whl"]


def test_the_time_limit_kills_pip(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse)
    settings = offline(tmp_path, wheelhouse, pip_download_timeout_seconds=0.05)
    with pytest.raises(WheelDownloadError, match=r"took longer than 0\.05 s"):
        fetch_wheels(settings, ["gate-e2e-demo==1.0"], tmp_path / "wheels")


def test_the_byte_budget_counts_what_was_fetched(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse)
    settings = offline(tmp_path, wheelhouse, pip_download_max_bytes=100)
    with pytest.raises(WheelDownloadError, match="wheels exceed 100 bytes"):
        fetch_wheels(settings, ["gate-e2e-demo==1.0"], tmp_path / "wheels")
    assert not (tmp_path / "wheels").exists()


WHEEL = "big-1.0-py3-none-any.whl"
BIG_BYTES = 256 * 1024 * 1024


class SlowIndex(http.server.BaseHTTPRequestHandler):
    """A simple index with one huge wheel, served in small pieces for as long as pip reads."""

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/simple/big"):
            body = f'<html><body><a href="/files/{WHEEL}">{WHEEL}</a></body></html>'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == f"/files/{WHEEL}":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(BIG_BYTES))
            self.end_headers()
            piece = b"\0" * 65536
            try:
                for _ in range(BIG_BYTES // len(piece)):
                    self.wfile.write(piece)
                    time.sleep(0.05)  # the whole file would take over 200 s
            except OSError:
                return  # pip was killed
        else:
            self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def slow_index() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowIndex)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_the_byte_budget_kills_pip_mid_download(
    tmp_path: Path, slow_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "PIP_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(
        pip_index_url=slow_index, data_dir=tmp_path / "data", pip_download_max_bytes=2_000_000
    )
    started = time.monotonic()
    with pytest.raises(WheelDownloadError, match="wheels exceed 2000000 bytes"):
        fetch_wheels(settings, ["big==1.0"], tmp_path / "wheels")
    # Killed long before the 256 MiB arrived (over 200 s): the bound is far from both.
    assert time.monotonic() - started < 100

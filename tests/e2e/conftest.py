"""A real `gate serve` (embedded Postgres, real Docker) for end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

STARTUP_SECONDS = 900  # a first start bootstraps the base image and builds the runner


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def gate_url(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    data_dir = tmp_path_factory.mktemp("gate-data")
    log_path = Path(data_dir) / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    env.update({"GATE_DATA_DIR": str(data_dir), "GATE_PORT": str(port), "GATE_ENV": "testing"})
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gate_service.cli", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"gate serve exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}"
                )
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"gate serve not ready in {STARTUP_SECONDS} s:\n{log_path.read_text()[-4000:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()

"""Real `gate` processes (real Postgres, real Docker) for end-to-end tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.ports import free_port
from tests.fixtures.processes import ends_with_this_process
from tests.fixtures.projects import RUNNER_TAKEOVER_WHEEL, make_wheel

STARTUP_SECONDS = 900  # a first start bootstraps the base image and builds the runner


def start(command: str, data_dir: Path, **settings: str) -> tuple[subprocess.Popen[bytes], Path]:
    """`gate <command>` in a subprocess with only the GATE_ settings given here."""
    log_path = data_dir / f"{command}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    if "GATE_BASE_IMAGE_SOURCE" in os.environ:  # the base the tests pin (tests/conftest.py)
        env["GATE_BASE_IMAGE_SOURCE"] = os.environ["GATE_BASE_IMAGE_SOURCE"]
    if "GATE_CASE_RUNTIME" in os.environ:  # CI's second pass: every case under gVisor
        env["GATE_CASE_RUNTIME"] = os.environ["GATE_CASE_RUNTIME"]
    env.update(
        {
            "GATE_DATA_DIR": str(data_dir),
            "GATE_BOOTSTRAP_TOKEN": ADMIN_TOKEN,
            **settings,
        }
    )
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gate_service.cli", command],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            # An interrupted or killed test run reaches no `finally`: the kernel ends the
            # server with it (SIGTERM, which stops it and its embedded Postgres cleanly).
            preexec_fn=ends_with_this_process(),
        )
    return proc, log_path


def wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        if proc.poll() is not None:
            pytest.fail(
                f"{proc.args!r} exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}"
            )
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"not ready in {STARTUP_SECONDS} s:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.5)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


@dataclass(frozen=True)
class Running:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path


@contextmanager
def running(command: str, data_dir: Path, **settings: str) -> Iterator[Running]:
    """`gate <command>` (see start) on a free port, ready when entered, stopped on leaving."""
    port = free_port()
    proc, log_path = start(command, data_dir, GATE_PORT=str(port), **settings)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log_path)
        yield Running(url, proc, log_path)
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def gate_url(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`gate serve` on its embedded default: its own Postgres, images, one worker."""
    wheelhouse = Path(tmp_path_factory.mktemp("wheelhouse"))
    make_wheel(wheelhouse)
    make_wheel(wheelhouse, "gate_takeover", extra_files=RUNNER_TAKEOVER_WHEEL)
    # Not under pytest's root: the embedded Postgres runs as a user of its own, and any
    # pytest session that starts meanwhile (another run on this machine) sets that root back
    # to 0700, which cut the server off from its data mid-run ("Permission denied", then
    # every request 500).
    serve_dir = Path(tempfile.mkdtemp(prefix="gate-e2e-serve-", dir="/var/tmp"))
    try:
        with running("serve", serve_dir, GATE_WHEELHOUSE_DIR=str(wheelhouse)) as serve:
            yield serve.url
    finally:
        shutil.rmtree(serve_dir, ignore_errors=True)

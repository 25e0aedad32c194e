"""A Docker engine that restarts while a case runs is an infrastructure fault (SandboxError:
the job is retried, then `error`), never a case that "ran past its hard deadline".

The machine's own engine is shared (other tests, CI), so it is never restarted here: each test
starts a PRIVATE dockerd beside it (its own data root, exec root, socket and managed
containerd; no bridge, no iptables), imports a tiny image into it (/bin/sleep and its
libraries), runs a case container through DockerSandbox pointed at that daemon, and kills or
stops that daemon mid-run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from gate_service.config import Settings
from gate_service.sandbox import RunLimits, RunResult, SandboxError
from gate_service.sandbox.docker import DockerSandbox
from tests.fixtures.engines import PrivateDaemon, can_start_engines, private_engine

pytestmark = pytest.mark.docker

IMAGE = "gate-test:engine-restart"
LIMITS = RunLimits(
    memory_mb=128, cpus=1, pids=64, wall_seconds=60, tmpfs_mb=16, output_limit_bytes=100_000
)


def libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return [w for line in out.splitlines() for w in line.split() if w.startswith("/")]


def tiny_image_tar(dest: Path) -> Path:
    """A root filesystem holding only /bin/sleep and the libraries it loads."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    tar_path = dest / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(os.path.realpath(sleep), arcname="bin/sleep")
        for lib in libraries(sleep):
            tar.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
        for empty in ("tmp", "bundle"):
            info = tarfile.TarInfo(empty)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
    return tar_path


@pytest.fixture
def private_daemon(docker_engine: None) -> Iterator[PrivateDaemon]:
    if not can_start_engines():
        pytest.skip("a private dockerd needs root and the dockerd binary")
    with private_engine() as daemon:
        client = docker.DockerClient(base_url=daemon.url, timeout=60)
        repo, tag = IMAGE.split(":")
        client.api.import_image_from_file(
            str(tiny_image_tar(daemon.root)), repository=repo, tag=tag
        )
        client.close()
        yield daemon


def run_in_thread(daemon: PrivateDaemon) -> tuple[threading.Thread, list[object]]:
    client = docker.DockerClient(base_url=daemon.url, timeout=120)
    sandbox = DockerSandbox(Settings(), client=client)
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(
                sandbox.run(IMAGE, ["/bin/sleep", "300"], limits=LIMITS, labels={"t": "restart"})
            )
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    # Until the container runs.
    deadline = time.monotonic() + 60
    while not client.containers.list(
        filters={"label": "t=restart", "status": "running"}, ignore_removed=True
    ):
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.2)
    return thread, outcome


def assert_infrastructure(outcome: list[object], started: float) -> None:
    assert len(outcome) == 1
    result = outcome[0]
    assert not isinstance(result, RunResult), f"judged as a case outcome: {result}"
    assert isinstance(result, SandboxError), repr(result)
    # Reported when the engine went away, not at the case's wall deadline.
    assert time.monotonic() - started < LIMITS.wall_seconds


def test_an_engine_killed_and_restarted_mid_case_is_a_sandbox_error(
    private_daemon: PrivateDaemon,
) -> None:
    started = time.monotonic()
    thread, outcome = run_in_thread(private_daemon)
    private_daemon.kill()
    private_daemon.start()
    thread.join(timeout=LIMITS.wall_seconds + 30)
    assert not thread.is_alive()
    assert_infrastructure(outcome, started)


def test_an_engine_stopped_mid_case_is_a_sandbox_error(private_daemon: PrivateDaemon) -> None:
    # A clean daemon stop (systemctl restart docker) stops the containers first: wait()
    # may answer with their exit code before the connection goes.
    started = time.monotonic()
    thread, outcome = run_in_thread(private_daemon)
    private_daemon.stop()
    private_daemon.start()
    thread.join(timeout=LIMITS.wall_seconds + 30)
    assert not thread.is_alive()
    assert_infrastructure(outcome, started)

"""The job's halt event stops an image build and a case container on a real engine (a private
dockerd, see test_engine_restart.py; the machine's engine is never disturbed)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import docker
import pytest

from gate_service.config import Settings
from gate_service.sandbox import Halted
from gate_service.sandbox.docker import DockerSandbox
from tests.e2e.test_engine_restart import IMAGE, LIMITS, private_daemon
from tests.fixtures.engines import PrivateDaemon

__all__ = ["private_daemon"]  # the fixture, used by name below
pytestmark = pytest.mark.docker


def wait_for(condition: object, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def test_a_halt_stops_an_image_build(private_daemon: PrivateDaemon, tmp_path: Path) -> None:
    client = docker.DockerClient(base_url=private_daemon.url, timeout=120)
    sandbox = DockerSandbox(Settings(data_dir=tmp_path / "data"), client=client)
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f'FROM {IMAGE}\nRUN ["/bin/sleep", "120"]\n')
    halt = threading.Event()
    threading.Timer(3.0, halt.set).start()
    started = time.monotonic()
    with pytest.raises(Halted):
        sandbox._build(
            "building a test image",
            timeout_seconds=300,
            output_limit_bytes=1_000_000,
            halt=halt,
            path=str(context),
            tag="gate-test:halted",
            rm=True,
            forcerm=True,
            pull=False,
            network_mode="none",
        )
    assert time.monotonic() - started < 20
    # The engine cancels a build whose client went away: its step container goes too.
    assert wait_for(lambda: not client.containers.list(all=True, ignore_removed=True))
    assert not any("gate-test:halted" in image.tags for image in client.images.list())


def test_a_halt_removes_a_running_case_container(private_daemon: PrivateDaemon) -> None:
    client = docker.DockerClient(base_url=private_daemon.url, timeout=120)
    sandbox = DockerSandbox(Settings(), client=client)
    halt = threading.Event()
    threading.Timer(2.0, halt.set).start()
    started = time.monotonic()
    with pytest.raises(Halted):
        sandbox.run(IMAGE, ["/bin/sleep", "300"], limits=LIMITS, labels={"t": "halt"}, halt=halt)
    assert time.monotonic() - started < LIMITS.wall_seconds
    assert wait_for(
        lambda: (
            not client.containers.list(all=True, filters={"label": "t=halt"}, ignore_removed=True)
        )
    )

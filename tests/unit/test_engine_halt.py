"""The job's halt event stops the engine's work for it (issue #12 item 5): no case container
is created or started once it is set, one running is removed, and a pip download is killed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate_service.bundles.wheels import DownloadHalted, fetch_wheels
from gate_service.config import Settings
from gate_service.sandbox import Halted
from gate_service.sandbox.docker import DockerSandbox
from tests.unit.test_engine_faults import LIMITS, StubClient, StubWire


def sandbox_for(wire: StubWire) -> DockerSandbox:
    sandbox = DockerSandbox(Settings(), client=StubClient())  # type: ignore[arg-type]
    sandbox.wire = wire
    return sandbox


def created(wire: StubWire) -> int:
    return sum(path == "/containers/create" for _, path, _ in wire.calls)


def started(wire: StubWire) -> bool:
    return any(path.endswith("/start") for _, path, _ in wire.calls)


def test_no_container_is_created_once_the_job_is_halted() -> None:
    halt = threading.Event()
    halt.set()
    wire = StubWire(0)
    with pytest.raises(Halted):
        sandbox_for(wire).run("img", ["true"], limits=LIMITS, labels={}, halt=halt)
    assert created(wire) == 0


def test_a_container_created_as_the_job_halts_is_removed_unstarted() -> None:
    # The heartbeat sets halt, then removes the gate's containers: one whose create was in
    # flight during that pass is caught by the look after create.
    halt = threading.Event()

    class HaltingOnCreate(StubWire):
        def call(self, method: str, path: str, **kwargs: Any) -> Any:
            answer = super().call(method, path, **kwargs)
            if path == "/containers/create":
                halt.set()
            return answer

    wire = HaltingOnCreate(0)
    with pytest.raises(Halted):
        sandbox_for(wire).run("img", ["true"], limits=LIMITS, labels={}, halt=halt)
    assert created(wire) == 1 and not started(wire) and wire.removed


def test_a_running_container_is_removed_when_the_job_halts() -> None:
    halt = threading.Event()

    def wait(timeout: float) -> dict[str, Any]:  # as the engine: wait ends when it is removed
        assert wire.gone.wait(timeout)
        return {"StatusCode": 137}

    wire = StubWire(wait)
    threading.Timer(0.3, halt.set).start()
    began = time.monotonic()
    with pytest.raises(Halted):
        sandbox_for(wire).run("img", ["true"], limits=LIMITS, labels={}, halt=halt)
    assert wire.removed and time.monotonic() - began < LIMITS.wall_seconds


@pytest.fixture
def silent_index() -> Iterator[str]:
    """An index that accepts connections and never answers: pip waits on it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/simple"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def pip_processes(dest: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(dest).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_halt_kills_a_running_pip_download(silent_index: str, tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", pip_index_url=silent_index, pip_download_timeout_seconds=120
    )
    dest = tmp_path / "wheels"
    halt = threading.Event()
    threading.Timer(2.0, halt.set).start()
    started = time.monotonic()
    with pytest.raises(DownloadHalted):
        fetch_wheels(settings, ["gate-never-served==1.0"], dest, halt)
    assert time.monotonic() - started < 10  # at the halt, not at pip's own timeouts
    assert pip_processes(dest) == []
    assert not dest.exists()

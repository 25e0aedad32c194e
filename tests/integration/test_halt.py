"""A cancel reaches the work in progress (issue #12 item 5): the job's halt event, set by the
heartbeat, stops a download or image build in the sandbox, and the gate ends `cancelled` with
no case run. Real Postgres and queue, the fake sandbox (the Docker side of the same contract
is in tests/unit/test_engine_halt.py and tests/e2e/test_engine_halt.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service import sandbox as port
from gate_service.bundles.wheels import DownloadHalted
from gate_service.config import Settings
from gate_service.sandbox import Halted
from gate_service.worker.loop import Worker
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.sandbox import FakeSandbox, fake_wheels, fake_worker


class SlowEngine(FakeSandbox):
    """A download and a build that only end when the job is halted (or after a minute)."""

    def __init__(self, slow: str) -> None:
        super().__init__()
        self.slow = slow
        self.started = threading.Event()
        self.halted: list[str] = []

    def _hang(
        self, what: str, halt: threading.Event | None, error: type[Exception] = Halted
    ) -> None:
        self.started.set()
        assert halt is not None, f"{what} was not given the job's halt event"
        if halt.wait(60):
            self.halted.append(what)
            raise error(f"the job was halted during the {what}")

    def download_wheels(
        self, requirements: Sequence[str], dest: Path, *, halt: threading.Event | None = None
    ) -> None:
        if self.slow == "download":
            self._hang("download", halt, DownloadHalted)  # as bundles.wheels raises it
        super().download_wheels(requirements, dest, halt=halt)

    def build_test_image(
        self, spec: port.TestImageSpec, *, halt: threading.Event | None = None
    ) -> str:
        if self.slow == "build":
            self._hang("build", halt)
        return super().build_test_image(spec, halt=halt)


@pytest.mark.parametrize("slow", ["download", "build"])
def test_a_cancel_stops_the_download_or_build_and_no_case_runs(
    slow: str,
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = calculator_project(tmp_path / "p", failing=False)
    (project / "requirements.txt").write_text("gate-slow-dependency==1.0\n")
    response = client.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(project))})
    assert response.status_code == 202, response.text
    gate_id = response.json()["id"]

    engine = SlowEngine(slow)
    fake_wheels(monkeypatch, engine)
    worker: Worker = fake_worker(settings, sessions, engine)
    started = time.monotonic()
    thread = threading.Thread(target=worker.run_once, daemon=True)
    thread.start()
    assert engine.started.wait(30), "the worker never reached the slow step"
    assert client.post(f"/v1/gates/{gate_id}/cancel").status_code in (200, 202)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the job did not stop"
    # The heartbeat notices a cancel within seconds; the step ended then, not after a minute.
    assert time.monotonic() - started < 30
    assert engine.halted == [slow]
    assert engine.runs == []
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert gate["status"] == "cancelled", gate

"""Fair scheduling on a real Postgres: claims go round-robin across projects, and a worker's
gate places and case slots are shared fairly between them (worker logic, the fake sandbox)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate_service import jobs
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.models import Gate, Job
from gate_service.sandbox import RunResult, SandboxError
from tests.fixtures.auth import as_token, project_token
from tests.fixtures.projects import AGENTS, bundle_of, write
from tests.fixtures.sandbox import FakeSandbox, fake_worker
from tests.fixtures.waiting import wait_until


def cases_project(root: Path, cases: int) -> Path:
    """A project of ``cases`` quick, passing cases (one invocation each)."""
    tests = "".join(
        f"""
          - name: adds_{i}
            payload: '{{"a": {i}, "b": 1}}'
            expected_result: output.sum == {i + 1}
        """
        for i in range(cases)
    )
    return write(root, {**AGENTS, "tests/many.yaml": "agent: calc\ntests:" + tests})


def submit(client: TestClient, data: bytes) -> uuid.UUID:
    response = client.post("/v1/gates", files={"bundle": ("b.tgz", data)})
    assert response.status_code == 202, response.text
    return uuid.UUID(response.json()["id"])


def project_b(client: TestClient) -> TestClient:
    return as_token(client, project_token(client, "project-b", ["submit", "read"]))


def test_the_second_claim_takes_the_other_projects_gate(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    data = bundle_of(cases_project(tmp_path / "p", 1))
    a_gates = [submit(client, data) for _ in range(5)]  # project `default`
    b_gate = submit(project_b(client), data)
    claimed = []
    for name in ("w1", "w2", "w3"):
        with session_scope(sessions) as s:
            job = jobs.claim(
                s,
                owner=name,
                lease_seconds=60,
                max_running_per_project=settings.max_running_gates_per_project,
            )
        assert job is not None
        claimed.append(job.gate_id)
    # A's oldest, then B's (B was never served), then A's next.
    assert claimed == [a_gates[0], b_gate, a_gates[1]]


def test_the_uncapped_claim_is_fair_too(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    data = bundle_of(cases_project(tmp_path / "p", 1))
    a_gates = [submit(client, data) for _ in range(3)]
    b_gate = submit(project_b(client), data)
    claimed = []
    for name in ("w1", "w2"):
        with session_scope(sessions) as s:
            job = jobs.claim(s, owner=name, lease_seconds=60)
        assert job is not None
        claimed.append(job.gate_id)
    assert claimed == [a_gates[0], b_gate]


def test_a_worker_serves_projects_in_turn(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    # One place: A's first gate takes it, and B's first is taken beside it at once (B is
    # under its share, slots.py); from then on each project has one gate at a time.
    worker = fake_worker(settings.model_copy(update={"worker_gates": 1}), sessions, FakeSandbox())
    data = bundle_of(cases_project(tmp_path / "p", 1))
    a_gates = [submit(client, data) for _ in range(3)]
    b = project_b(client)
    b_gates = [submit(b, data) for _ in range(2)]
    while worker.run_once():
        pass
    with sessions() as s:
        gates = s.scalars(select(Gate).order_by(Gate.started_at)).all()
        assert {g.status for g in gates} == {"passed"}
        order = [g.id for g in gates]
    # Both first gates run side by side (which one's start is written first is a race).
    assert set(order[:2]) == {a_gates[0], b_gates[0]}  # B's first is not behind all of A's
    assert [g for g in order if g in a_gates] == a_gates  # each project's oldest first
    assert [g for g in order if g in b_gates] == b_gates


def test_a_small_gate_submitted_after_a_large_one_finishes_first(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    sandbox: FakeSandbox,
    tmp_path: Path,
) -> None:
    assert (settings.worker_gates, settings.case_concurrency) == (2, 2)
    worker = fake_worker(settings, sessions, sandbox)
    large = submit(client, bundle_of(cases_project(tmp_path / "large", 200)))
    small = submit(project_b(client), bundle_of(cases_project(tmp_path / "small", 2)))
    assert worker.run_once() is True  # took both gates; their cases shared its two slots
    with sessions() as s:
        finished = {g.id: (g.status, g.finished_at) for g in s.scalars(select(Gate))}
    assert finished[large][0] == finished[small][0] == "passed"
    small_at, large_at = finished[small][1], finished[large][1]
    assert small_at is not None and large_at is not None
    assert small_at < large_at
    assert len(sandbox.runs) == 202


class SlowSandbox(FakeSandbox):
    """Cases of the `slow_*` tests hold their container until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.slow_running = 0
        self._lock = threading.Lock()

    def run(self, image: str, argv: Sequence[str], **kw: Any) -> RunResult:
        if any(a.startswith("--case=slow_") for a in argv):
            with self._lock:
                self.slow_running += 1
            try:
                self.release.wait(120)
            finally:
                with self._lock:
                    self.slow_running -= 1
        return super().run(image, argv, **kw)


def slow_project(root: Path, cases: int) -> Path:
    """A project of ``cases`` cases named ``slow_*``, which SlowSandbox holds."""
    tests = "".join(
        f"""
          - name: slow_{i}
            payload: '{{"a": 1, "b": 1}}'
        """
        for i in range(cases)
    )
    return write(root, {**AGENTS, "tests/slow.yaml": "agent: calc\ntests:" + tests})


def gate_status(sessions: sessionmaker[Session], gate_id: uuid.UUID) -> str:
    with sessions() as s:
        return str(s.get_one(Gate, gate_id).status)


def test_one_projects_slow_gates_leave_room_for_another_projects_gate(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """Two gates of A whose cases hang hold both places and both case slots; B's one-case
    gate is still taken and judged, beside them, while they hang (slots.py's rule)."""
    assert (settings.worker_gates, settings.case_concurrency) == (2, 2)
    sandbox = SlowSandbox()
    worker = fake_worker(settings, sessions, sandbox)
    slow = slow_project(tmp_path / "slow", 2)
    a_gates = [submit(client, bundle_of(slow)) for _ in range(2)]
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: sandbox.slow_running == 2, "A's cases holding both slots")
        b_gate = submit(project_b(client), bundle_of(cases_project(tmp_path / "b", 1)))
        wait_until(lambda: gate_status(sessions, b_gate) == "passed", "B's gate passed")
        assert [gate_status(sessions, g) for g in a_gates] == ["running", "running"]
        assert sandbox.slow_running == 2  # A's cases still hang: B was served beside them
    finally:
        sandbox.release.set()
        wait_until(lambda: all(gate_status(sessions, g) == "passed" for g in a_gates), "A's gates")
        worker.ctx.stop.set()
        thread.join(timeout=30)


class FlakyOnceSandbox(SlowSandbox):
    """As SlowSandbox; and the first run of a `flaky_*` case raises an engine error."""

    def __init__(self) -> None:
        super().__init__()
        self.flaky_failed = False

    def run(self, image: str, argv: Sequence[str], **kw: Any) -> RunResult:
        if any(a.startswith("--case=flaky_") for a in argv) and not self.flaky_failed:
            self.flaky_failed = True
            raise SandboxError("the engine hiccuped")
        return super().run(image, argv, **kw)


def test_a_gate_handed_back_for_a_retry_is_not_stuck_behind_the_gates_still_held(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """A's gate hangs in its case; B's gate fails its first attempt on an engine error and is
    handed back. The same worker takes it again at once and judges it while A's still hangs
    (it used to wait until every gate the worker held had ended)."""
    sandbox = FlakyOnceSandbox()
    worker = fake_worker(settings, sessions, sandbox)
    slow = slow_project(tmp_path / "slow", 1)
    flaky = write(
        tmp_path / "flaky",
        {
            **AGENTS,
            "tests/flaky.yaml": """
                agent: calc
                tests:
                  - name: flaky_one
                    payload: '{"a": 1, "b": 1}'
                    expected_result: output.sum == 2
            """,
        },
    )
    a_gate = submit(client, bundle_of(slow))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: sandbox.slow_running == 1, "A's case holding its slot")
        b_gate = submit(project_b(client), bundle_of(flaky))
        wait_until(lambda: gate_status(sessions, b_gate) == "passed", "B's gate passed")
        assert sandbox.flaky_failed  # its first attempt did fail
        with sessions() as s:
            assert s.scalars(select(Job.attempts).where(Job.gate_id == b_gate)).one() == 2
        assert gate_status(sessions, a_gate) == "running"
        assert sandbox.slow_running == 1  # A's case still hangs: B did not wait for it
    finally:
        sandbox.release.set()
        wait_until(lambda: gate_status(sessions, a_gate) == "passed", "A's gate")
        worker.ctx.stop.set()
        thread.join(timeout=30)

"""Fair scheduling on a real Postgres: claims go round-robin across projects."""

from __future__ import annotations

import uuid
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.models import Gate
from gate_service.worker import queue
from tests.fixtures.auth import as_token, project_token
from tests.fixtures.projects import AGENTS, bundle_of, write
from tests.fixtures.sandbox import FakeSandbox, fake_worker


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
            job = queue.claim(
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
            job = queue.claim(s, owner=name, lease_seconds=60)
        assert job is not None
        claimed.append(job.gate_id)
    assert claimed == [a_gates[0], b_gate]


def test_a_worker_serves_projects_in_turn(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    # One gate at a time, so that the order the gates started in is the order of the claims.
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
    assert order == [a_gates[0], b_gates[0], a_gates[1], b_gates[1], a_gates[2]]


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

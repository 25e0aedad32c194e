"""A project's model budget holds across worker processes: each worker's gateway charges
its calls in Postgres (gate_service/gateway/spend.py), so two gateways together answer no
more calls, tokens or cost than the project's limits allow.

Real Postgres, two real gateways (as two worker processes have), the OpenAI-compatible fake
provider on loopback. No assertion is on wall-clock time: windows come from a test clock.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate_service.gateway import Budgets, Limits, ModelGateway
from gate_service.gateway.spend import ProjectSpend
from gate_service.models import Project, ProjectModelSpend
from tests.fixtures.auth import project_token
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.gateway import ask

WINDOW_S = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000 * WINDOW_S

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gw-"))  # a Unix socket's path stays short
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def project_id(client: TestClient, sessions: sessionmaker[Session], name: str) -> str:
    project_token(client, name, ["read"])
    with sessions() as session:
        return str(session.scalar(select(Project.id).where(Project.name == name)))


def two_workers(
    sessions: sessionmaker[Session], root: Path, limits: Limits, clock: Clock
) -> list[ModelGateway]:
    budgets = Budgets(project=limits, project_window_s=WINDOW_S)
    return [
        ModelGateway(
            budgets=budgets,
            socket_root=root,
            retry_backoff_s=0.0,
            project_spend=ProjectSpend(sessions, clock=clock),
        )
        for _ in range(2)
    ]


def channel(gateway: ModelGateway, project: str, provider: FakeProvider, case: str) -> Any:
    return gateway.open_channel(
        gate_id=f"gate-{case}",
        case_id=case,
        project_id=project,
        secrets={"OPENAI_API_KEY": "sk-spend", "OPENAI_API_BASE": provider.url},
        deadline=time.monotonic() + 120,
    )


def test_a_projects_call_budget_is_shared_by_two_workers_and_starts_again_next_window(
    client: TestClient, sessions: sessionmaker[Session], provider: FakeProvider, root: Path
) -> None:
    clock = Clock()
    alpha = project_id(client, sessions, "alpha")
    one, two = two_workers(sessions, root, Limits(calls=2), clock)
    first, second = channel(one, alpha, provider, "c1"), channel(two, alpha, provider, "c2")
    try:
        assert ask(first)[0] == 200
        assert ask(second)[0] == 200
        # The third call, on either worker, finds the project's two calls spent.
        for ch in (first, second):
            status, answer = ask(ch)
            assert status == 429, answer
            assert answer["error"]["limit"] == "project.calls"
            assert answer["error"]["message"] == "project.calls budget of 2 reached (2 used)"
        assert len(provider.calls) == 2
        clock.now += WINDOW_S  # the next window
        assert ask(second)[0] == 200
    finally:
        first.close()
        second.close()
    with sessions() as session:
        rows = session.scalars(select(ProjectModelSpend).order_by(ProjectModelSpend.window_start))
        assert [(r.calls, r.tokens) for r in rows] == [(2, 14), (1, 7)]


def test_tokens_spent_on_one_worker_count_on_the_other(
    client: TestClient, sessions: sessionmaker[Session], provider: FakeProvider, root: Path
) -> None:
    alpha = project_id(client, sessions, "alpha")
    beta = project_id(client, sessions, "beta")
    one, two = two_workers(sessions, root, Limits(tokens=10), Clock())
    channels = [channel(one, alpha, provider, "c1"), channel(two, alpha, provider, "c2")]
    other = channel(two, beta, provider, "c3")
    try:
        assert ask(channels[0])[0] == 200  # 7 tokens
        assert ask(channels[1])[0] == 200  # 14: the call that crosses the limit is answered
        status, answer = ask(channels[0])
        assert status == 429 and answer["error"]["limit"] == "project.tokens", answer
        assert "(14 used)" in answer["error"]["message"]
        assert ask(other)[0] == 200  # another project's budget is its own
    finally:
        for ch in (*channels, other):
            ch.close()


def test_two_workers_racing_for_a_projects_last_calls_answer_no_more_than_allowed(
    client: TestClient, sessions: sessionmaker[Session], provider: FakeProvider, root: Path
) -> None:
    alpha = project_id(client, sessions, "alpha")
    workers = two_workers(sessions, root, Limits(calls=5), Clock())
    channels = [channel(workers[i % 2], alpha, provider, f"c{i}") for i in range(12)]
    statuses: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(len(channels))

    def call(ch: Any) -> None:
        start.wait()
        status, _ = ask(ch)
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=call, args=(ch,)) for ch in channels]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        for ch in channels:
            ch.close()
    assert sorted(statuses) == [200] * 5 + [429] * 7
    assert len(provider.calls) == 5


def test_spending_settled_after_its_window_ends_counts_in_the_next(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    """A call charged in one window and answered in the next: its tokens are counted there,
    not lost to an UPDATE of a row that does not exist yet."""
    clock = Clock()
    alpha = project_id(client, sessions, "alpha")
    spend = ProjectSpend(sessions, clock=clock)
    assert spend.charge(alpha, "project", Limits(tokens=10), WINDOW_S) is None
    clock.now += WINDOW_S
    spend.add(alpha, WINDOW_S, tokens=12, cost_usd=0.5)
    refused = spend.charge(alpha, "project", Limits(tokens=10), WINDOW_S)
    assert refused is not None and refused.error.limit == "project.tokens", refused
    with sessions() as session:
        rows = session.scalars(select(ProjectModelSpend).order_by(ProjectModelSpend.window_start))
        assert [(r.calls, r.tokens) for r in rows] == [(1, 0), (0, 12)]

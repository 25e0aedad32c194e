"""A gate's cases are paged in GET /v1/gates/{id}, and every reader that needs them all (the
client, the connic routes) gets them all (real Postgres, no worker)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.bundles.suites import CaseRef
from gate_service.client.api import GateClient
from gate_service.gates import lifecycle, views
from gate_service.models import Case, CaseStatus, Gate
from tests.fixtures.auth import bearer
from tests.fixtures.projects import bundle_of, calculator_project

CASES = 250


def gate_with_cases(client: TestClient, sessions: sessionmaker[Session], tmp_path: Path) -> str:
    """A queued gate given CASES case rows (the worker would write them as it validates),
    the first 7 of them judged: 4 passed, 3 failed."""
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    gate_id = client.post("/v1/gates", files={"bundle": ("p.tgz", data)}).json()["id"]
    with sessions.begin() as session:
        gate = session.get_one(Gate, uuid.UUID(gate_id))
        refs = [
            CaseRef("tests/calc.yaml", "calc", f"case_{n:03}", 1, 100, 60) for n in range(CASES)
        ]
        for n, case in enumerate(lifecycle.save_cases(session, gate, refs)[:7]):
            case.status = CaseStatus.passed if n < 4 else CaseStatus.failed
            case.passed = n < 4
    return str(gate_id)


def test_get_answers_a_page_of_cases_and_the_path_of_the_rest(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id = gate_with_cases(client, sessions, tmp_path)
    gate = client.get(f"/v1/gates/{gate_id}").json()
    # The counts are the whole gate's, whatever page the body holds.
    assert (gate["total_cases"], gate["passed_cases"], gate["failed_cases"]) == (CASES, 4, 3)
    assert gate["judged_cases"] == 7
    assert len(gate["cases"]) == views.CASES_PAGE
    names = [c["test_name"] for c in gate["cases"]]
    following = gate["next_cases"]
    while following:
        page = client.get(following).json()
        names += [c["test_name"] for c in page["items"]]
        following = page["next"]
    assert names == [f"case_{n:03}" for n in range(CASES)]

    small = client.get(f"/v1/gates/{gate_id}", params={"cases_limit": 0})
    assert small.json()["cases"] == [] and small.json()["total_cases"] == CASES
    assert small.json()["next_cases"] == f"/v1/gates/{gate_id}/cases?after=-1&limit=100"
    # Another page size is another representation: its ETag is not the default body's.
    assert small.headers["ETag"] != client.get(f"/v1/gates/{gate_id}").headers["ETag"]
    everything = client.get(f"/v1/gates/{gate_id}", params={"cases_limit": 1000}).json()
    assert len(everything["cases"]) == CASES and everything["next_cases"] is None


def test_a_small_gate_has_no_next_page(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    gate_id = client.post("/v1/gates", files={"bundle": ("p.tgz", data)}).json()["id"]
    assert client.get(f"/v1/gates/{gate_id}").json()["next_cases"] is None


class Through(httpx.BaseTransport):
    """The client's requests, answered by the app through the TestClient (its token)."""

    def __init__(self, app: TestClient) -> None:
        self.app = app

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.app.request(request.method, str(request.url), content=request.read())
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def test_the_client_follows_the_pages(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id = gate_with_cases(client, sessions, tmp_path)
    api = GateClient("http://testserver", transport=Through(client))
    try:
        gate = api.gate(gate_id)
    finally:
        api.close()
    assert [c["test_name"] for c in gate["cases"]] == [f"case_{n:03}" for n in range(CASES)]
    assert gate["next_cases"] is None


def test_the_connic_routes_read_every_case(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id = gate_with_cases(client, sessions, tmp_path)
    with sessions() as session:
        project_id = session.get_one(Gate, uuid.UUID(gate_id)).project_id
        full = views.read_gate(session, uuid.UUID(gate_id), project_id)
    assert len(full.cases) == CASES and full.next_cases is None


def test_another_projects_token_cannot_page_a_gates_cases(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id = gate_with_cases(client, sessions, tmp_path)
    assert client.post("/v1/projects", json={"name": "other"}).status_code == 201
    token = client.post("/v1/projects/other/tokens", json={"scopes": ["read"]}).json()["token"]
    other = client.get(f"/v1/gates/{gate_id}/cases", headers=bearer(token))
    assert other.status_code == 404
    with sessions() as session:
        assert session.query(Case).filter(Case.gate_id == uuid.UUID(gate_id)).count() == CASES


def test_waiting_polls_without_cases_and_ends_with_all_of_them(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id = gate_with_cases(client, sessions, tmp_path)
    with sessions.begin() as session:
        gate = session.get_one(Gate, uuid.UUID(gate_id))
        gate.status = "passed"
        gate.revision += 1
    seen: list[dict[str, object]] = []
    api = GateClient("http://testserver", transport=Through(client))
    try:
        done = api.wait(gate_id, timeout_s=30, on_change=seen.append)
    finally:
        api.close()
    assert [c["test_name"] for c in done["cases"]] == [f"case_{n:03}" for n in range(CASES)]
    assert seen and seen[0]["cases"] == [] and seen[0]["judged_cases"] == 7

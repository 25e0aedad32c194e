"""DELETE /v1/projects/{name}: a project goes with everything of it, in one transaction.

Two projects, `alpha` (deleted) and `beta` (kept), each with every kind of row a project
has: tokens, a results-page session, secrets, model routes, egress hosts, an API spec, a
judged gate (cases, runs), model calls, model spending, audit events, and a queued gate of a
bundle both submitted. After the deletion no
row of alpha is left in any table, beta's rows are all there, alpha's tokens answer 401, and
the deletion is audited under `default`. A gate being judged when its project is deleted
stops within seconds, its worker writing nothing and logging no error. Real Postgres and
queue, the fake sandbox (the runner in-process).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gate_service import sandbox as port
from gate_service.auth.service import Principal, authenticate
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.models import Base, ModelCall, ProjectModelSpend
from gate_service.projects import deletion
from gate_service.sandbox import Halted
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN, as_token, bearer, project_token
from tests.fixtures.db import libpq_url
from tests.fixtures.projects import (
    bundle_of,
    calculator_project,
    sleepy_project,
    tool_cases_project,
)
from tests.fixtures.sandbox import FakeSandbox, fake_wheels, fake_worker

# Rows of one project, per table (:p its id). Every table is here or is a bundle table
# (checked below), so a new table must say how it belongs to a project.
OF_PROJECT = {
    "projects": "SELECT count(*) FROM projects WHERE id = :p",
    "api_tokens": "SELECT count(*) FROM api_tokens WHERE project_id = :p",
    "ui_sessions": "SELECT count(*) FROM ui_sessions s JOIN api_tokens t ON t.id = s.token_id "
    "WHERE t.project_id = :p",
    "project_secrets": "SELECT count(*) FROM project_secrets WHERE project_id = :p",
    "case_quarantines": "SELECT count(*) FROM case_quarantines WHERE project_id = :p",
    "project_model_spend": "SELECT count(*) FROM project_model_spend WHERE project_id = :p",
    "audit_events": "SELECT count(*) FROM audit_events WHERE project_id = :p",
    "gates": "SELECT count(*) FROM gates WHERE project_id = :p",
    "jobs": "SELECT count(*) FROM jobs j JOIN gates g ON g.id = j.gate_id WHERE g.project_id = :p",
    "cases": "SELECT count(*) FROM cases c JOIN gates g ON g.id = c.gate_id "
    "WHERE g.project_id = :p",
    "runs": "SELECT count(*) FROM runs r JOIN cases c ON c.id = r.case_id "
    "JOIN gates g ON g.id = c.gate_id WHERE g.project_id = :p",
    "model_calls": "SELECT count(*) FROM model_calls m JOIN gates g ON g.id = m.gate_id "
    "WHERE g.project_id = :p",
}
BUNDLE_TABLES = {"bundles", "bundle_chunks"}
ORIGIN = {"Origin": "http://testserver"}
SPEC = {
    "openapi": "3.0.3",
    "servers": [{"url": "https://orders.example.com"}],
    "paths": {"/orders/{id}": {"get": {"operationId": "getOrder"}}},
}


def test_every_table_is_counted_per_project() -> None:
    assert set(OF_PROJECT) | BUNDLE_TABLES == set(Base.metadata.tables)


def project_id(sessions: sessionmaker[Session], name: str) -> uuid.UUID | None:
    with session_scope(sessions) as s:
        found = s.execute(text("SELECT id FROM projects WHERE name = :n"), {"n": name}).scalar()
        return uuid.UUID(str(found)) if found is not None else None


def rows_of(sessions: sessionmaker[Session], pid: uuid.UUID) -> dict[str, int]:
    with session_scope(sessions) as s:
        return {t: int(s.execute(text(q), {"p": pid}).scalar_one()) for t, q in OF_PROJECT.items()}


def all_rows(sessions: sessionmaker[Session]) -> dict[str, int]:
    with session_scope(sessions) as s:
        return {
            t: int(s.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
            for t in Base.metadata.tables
        }


def bundles(sessions: sessionmaker[Session]) -> dict[str, int]:
    """Stored bundles and how many chunks each has."""
    with session_scope(sessions) as s:
        return {
            r.sha256: int(r.chunks)
            for r in s.execute(
                text(
                    "SELECT b.sha256, (SELECT count(*) FROM bundle_chunks c "
                    "WHERE c.sha256 = b.sha256) AS chunks FROM bundles b"
                )
            )
        }


def browser(client: TestClient) -> TestClient:
    return TestClient(client.app, follow_redirects=False, headers=ORIGIN)


@dataclass
class Tenant:
    name: str
    id: uuid.UUID
    api: TestClient  # a submit+read token's client
    admin: TestClient  # an admin token of the project
    page: TestClient  # a browser signed in to the results pages
    gate_id: str
    shared_gate_id: str  # a gate of the bundle both projects submitted


def submit(c: TestClient, data: bytes) -> str:
    r = c.post("/v1/gates", files={"bundle": ("b.tgz", data)})
    assert r.status_code in (200, 202), r.text
    return str(r.json()["id"])


def add_model_calls(sessions: sessionmaker[Session], gate_id: str, n: int = 2) -> None:
    with session_scope(sessions) as s:
        case_id = s.execute(
            text("SELECT id FROM cases WHERE gate_id = :g ORDER BY position LIMIT 1"),
            {"g": gate_id},
        ).scalar_one()
        for position in range(n):
            s.add(
                ModelCall(
                    gate_id=uuid.UUID(gate_id),
                    case_id=case_id,
                    position=position,
                    agent="calc",
                    model="openai/gpt-4o-mini",
                    request_hash=f"{position:064x}",
                    request={"messages": []},
                    response={"content": "ok"},
                    status="ok",
                    stored_bytes=10,
                )
            )
        s.execute(
            text("UPDATE gates SET result_bytes = result_bytes + :n WHERE id = :g"),
            {"g": gate_id, "n": 10 * n},
        )


def populate(
    client: TestClient,
    sessions: sessionmaker[Session],
    worker: Worker,
    tmp_path: Path,
    name: str,
) -> Tenant:
    api = as_token(client, project_token(client, name, ["submit", "read"]))
    admin = as_token(client, project_token(client, name, ["admin"]))
    pid = project_id(sessions, name)
    assert pid is not None
    page = browser(client)
    api_token = api.headers["authorization"].removeprefix("Bearer ")
    signed = page.post("/ui/sign-in", data={"token": api_token, "next": "/ui"})
    assert signed.status_code == 303, signed.text
    for secret in ("ORDERS_KEY", "CORP_KEY"):
        r = admin.put(f"/v1/projects/{name}/secrets/{secret}", json={"value": f"{name}-value"})
        assert r.status_code == 201, r.text
    route = {"pattern": "corp/*", "api_base": "http://llm-proxy:4000/v1", "key_secret": "CORP_KEY"}
    r = admin.put(f"/v1/projects/{name}/model-routes", json={"routes": [route]})
    assert r.status_code == 200, r.text
    r = admin.put(f"/v1/projects/{name}/egress", json={"hosts": ["orders.example.com"]})
    assert r.status_code == 200, r.text
    r = admin.put(f"/v1/projects/{name}/api-specs/orders", json={"spec": SPEC, "headers": {}})
    assert r.status_code == 200, r.text
    # A gate of a bundle of its own (a comment makes it the project's), judged: its cases
    # and runs, and model calls of one case.
    own = tool_cases_project(tmp_path / name, cases=3)
    with (own / "tests/calc_many.yaml").open("a") as suite:
        suite.write(f"# {name}'s own\n")
    gate_id = submit(api, bundle_of(own))
    assert worker.run_once()
    judged = api.get(f"/v1/gates/{gate_id}").json()
    assert judged["status"] == "passed"
    add_model_calls(sessions, gate_id)
    # One of its cases quarantined.
    named = {k: judged["cases"][0][k] for k in ("suite", "agent_name", "test_name")}
    ends = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    r = admin.post(
        f"/v1/projects/{name}/quarantine",
        json={"case": named, "owner": "ana", "reason": "r", "expires_at": ends},
    )
    assert r.status_code == 201, r.text
    with session_scope(sessions) as s:
        s.add(ProjectModelSpend(project_id=pid, window_start=0, calls=3, tokens=30, cost_usd=0.3))
    return Tenant(name, pid, api, admin, page, gate_id, shared_gate_id="")


@pytest.fixture
def tenants(
    client: TestClient, sessions: sessionmaker[Session], worker: Worker, tmp_path: Path
) -> dict[str, Tenant]:
    found = {name: populate(client, sessions, worker, tmp_path, name) for name in ("beta", "alpha")}
    # Then one queued gate each, of one bundle both submit (so no worker takes it above).
    shared = bundle_of(tool_cases_project(tmp_path / "shared", cases=2))
    for tenant in found.values():
        tenant.shared_gate_id = submit(tenant.api, shared)
    return found


def test_a_deleted_project_leaves_no_row_and_other_projects_keep_theirs(
    client: TestClient, sessions: sessionmaker[Session], tenants: dict[str, Tenant]
) -> None:
    alpha, beta = tenants["alpha"], tenants["beta"]
    default = project_id(sessions, "default")
    assert default is not None
    before = {p: rows_of(sessions, p) for p in (alpha.id, beta.id, default)}
    assert all(before[alpha.id].values()), before[alpha.id]  # every kind of row is there
    assert before[alpha.id]["jobs"] == 2 and before[alpha.id]["model_calls"] == 2
    totals = all_rows(sessions)
    stored = bundles(sessions)
    with session_scope(sessions) as s:
        alpha_only, shared = (
            s.execute(text("SELECT bundle_sha256 FROM gates WHERE id = :g"), {"g": g}).scalar_one()
            for g in (alpha.gate_id, alpha.shared_gate_id)
        )

    r = client.delete("/v1/projects/alpha")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["name"], answer["id"]) == ("alpha", str(alpha.id))
    counts = answer["counts"]
    expected = before[alpha.id]
    assert counts == {
        "gates": expected["gates"],
        "gates_stopped": 1,  # the queued one
        "cases": expected["cases"],
        "runs": expected["runs"],
        "model_calls": expected["model_calls"],
        "jobs": expected["jobs"],
        "tokens": expected["api_tokens"],
        "ui_sessions": expected["ui_sessions"],
        "secrets": expected["project_secrets"],
        "quarantines": expected["case_quarantines"],
        "spend_windows": expected["project_model_spend"],
        "audit_events": expected["audit_events"],
        "bundles": 1,
        "bundle_bytes": counts["bundle_bytes"],
        "result_bytes": counts["result_bytes"],
    }
    assert counts["bundle_bytes"] > 0 and counts["result_bytes"] > 20

    assert rows_of(sessions, alpha.id) == dict.fromkeys(OF_PROJECT, 0)
    assert project_id(sessions, "alpha") is None
    assert rows_of(sessions, beta.id) == before[beta.id]
    after_default = rows_of(sessions, default)
    assert after_default == {**before[default], "audit_events": before[default]["audit_events"] + 1}
    # Nothing else went anywhere: each table lost exactly alpha's rows (and gained the event).
    after = all_rows(sessions)
    for table in OF_PROJECT:
        gained = 1 if table == "audit_events" else 0
        assert after[table] == totals[table] - before[alpha.id][table] + gained, table
    # The bundle only alpha's gate referenced went with its chunks; the shared one stays.
    left = bundles(sessions)
    assert alpha_only not in left and shared in left
    assert left == {k: v for k, v in stored.items() if k != alpha_only}
    assert after["bundle_chunks"] == totals["bundle_chunks"] - stored[alpha_only]
    # beta's gates read as before.
    assert beta.api.get(f"/v1/gates/{beta.gate_id}").json()["status"] == "passed"
    assert beta.api.get(f"/v1/gates/{beta.shared_gate_id}").json()["status"] == "queued"


def test_a_deleted_projects_tokens_get_401_and_its_pages_sign_in_again(
    client: TestClient, tenants: dict[str, Tenant]
) -> None:
    alpha, beta = tenants["alpha"], tenants["beta"]
    assert alpha.page.get("/ui").status_code == 200
    assert client.delete("/v1/projects/alpha").status_code == 200
    for c, method, path in [
        (alpha.api, "GET", "/v1/gates"),
        (alpha.api, "GET", f"/v1/gates/{alpha.gate_id}"),
        (alpha.api, "GET", f"/v1/gates/{alpha.gate_id}?wait=1"),
        (alpha.api, "POST", "/v1/gates"),
        (alpha.admin, "GET", "/v1/projects/alpha/tokens"),
        (alpha.admin, "GET", "/v1/audit"),
    ]:
        r = c.request(method, path)
        assert r.status_code == 401, (method, path, r.text)
        assert r.json()["detail"] == "the token is not known"
    page = alpha.page.get("/ui")
    assert page.status_code in (302, 303, 307) and "/ui/sign-in" in page.headers["location"]
    # The admin of default sees it gone; beta's tokens and pages work as before.
    assert client.get("/v1/projects/alpha/tokens").status_code == 404
    assert beta.api.get("/v1/gates").json()["total"] == 2
    assert beta.page.get("/ui").status_code == 200


def test_the_deletion_is_audited_under_default_with_what_went(
    client: TestClient, sessions: sessionmaker[Session], tenants: dict[str, Tenant]
) -> None:
    alpha = tenants["alpha"]
    admin_token_id = client.get("/v1/projects/default/tokens").json()["items"][0]["id"]
    answer = client.delete("/v1/projects/alpha").json()
    events = client.get("/v1/audit", params={"action": "project.deleted"}).json()["items"]
    assert len(events) == 1
    (event,) = events
    assert event["project_id"] == str(project_id(sessions, "default"))
    assert event["token_id"] == admin_token_id
    assert event["detail"] == {"project": "alpha", "project_id": str(alpha.id), **answer["counts"]}
    # The project's own trail went with it; the service admin's record of it stays.
    assert not [
        e for e in client.get("/v1/audit", params={"limit": 500}).json()["items"]
        if e["project_id"] == str(alpha.id)
    ]  # fmt: skip
    # Beta's admin does not see default's events, the deletion among them.
    beta_events = tenants["beta"].admin.get("/v1/audit", params={"limit": 500}).json()["items"]
    assert "project.deleted" not in {e["action"] for e in beta_events}


def test_default_cannot_be_deleted_and_unknown_projects_are_404(client: TestClient) -> None:
    r = client.delete("/v1/projects/default")
    assert r.status_code == 409, r.text
    assert "'default' project cannot be deleted" in r.json()["detail"]
    for name in ("nobody", "Bad%20Name", "a" * 65):
        r = client.delete(f"/v1/projects/{name}")
        assert r.status_code == 404, (name, r.text)
    assert client.get("/v1/projects/default/tokens").status_code == 200


def test_only_admin_tokens_of_default_delete_projects(client: TestClient) -> None:
    alpha_admin = as_token(client, project_token(client, "alpha", ["admin"]))
    alpha_api = as_token(client, project_token(client, "alpha", ["submit", "read"]))
    project_token(client, "beta", ["read"])
    reader_of_default = as_token(client, project_token(client, "default", ["submit", "read"]))
    for c, target in [
        (alpha_admin, "alpha"),  # its own project
        (alpha_admin, "beta"),
        (alpha_admin, "default"),
        (alpha_api, "alpha"),
        (reader_of_default, "alpha"),  # default, without the admin scope
    ]:
        r = c.delete(f"/v1/projects/{target}")
        assert r.status_code == 403, (target, r.text)
    assert alpha_admin.get("/v1/projects/alpha/tokens").status_code == 200
    assert client.get("/v1/projects/beta/tokens").status_code == 200


# -- a gate being judged ---------------------------------------------------------------------


class SlowBuild(FakeSandbox):
    """A test-image build that only ends when the job is halted (or after a minute), while
    ``slow``."""

    def __init__(self) -> None:
        super().__init__()
        self.slow = True
        self.started = threading.Event()
        self.halted = False

    def build_test_image(
        self, spec: port.TestImageSpec, *, halt: threading.Event | None = None
    ) -> str:
        self.started.set()
        assert halt is not None
        if self.slow and halt.wait(60):
            self.halted = True
            raise Halted("the job was halted during the build")
        return super().build_test_image(spec, halt=halt)


def wait_for(what: str, check: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


@pytest.mark.parametrize("during", ["build", "cases"])
def test_a_gate_being_judged_stops_quietly_when_its_project_is_deleted(
    during: str,
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    alpha = as_token(client, project_token(client, "alpha", ["submit", "read"]))
    beta = as_token(client, project_token(client, "beta", ["submit", "read"]))
    cases = 4  # two at a time (case_concurrency), each for 30 s unless stopped
    gate_id = submit(
        alpha, bundle_of(sleepy_project(tmp_path / "a", cases, failing=False, sleep=30))
    )
    engine = SlowBuild() if during == "build" else FakeSandbox()
    fake_wheels(monkeypatch, engine)
    worker = fake_worker(settings, sessions, engine)
    thread = threading.Thread(target=worker.run_once, daemon=True)
    thread.start()
    if isinstance(engine, SlowBuild):
        assert engine.started.wait(30), "the build never started"
    else:
        wait_for("a case's start", lambda: len(engine.runs) >= 1)

    caplog.clear()
    deleted_at = time.monotonic()
    deleted = client.delete("/v1/projects/alpha")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["counts"]["gates_stopped"] == 1
    thread.join(timeout=30)
    assert not thread.is_alive(), "the worker did not stop judging the deleted gate"
    # Within the heartbeat's cancel check (2 s), not at the cases' or build's end.
    assert time.monotonic() - deleted_at < 15
    # Its containers went (the heartbeat's reap of this worker's containers of the gate);
    # at most the two cases started, nothing more.
    assert {"gate.gate_id": gate_id, "gate.owner": worker.name} in engine.reaped
    assert not [c for c in engine.containers if c.get("gate.gate_id") == gate_id]
    if isinstance(engine, SlowBuild):
        assert engine.halted and engine.runs == []
    else:
        assert 1 <= len(engine.runs) <= 2
    # Quietly: no error logged, and the worker said why it stopped.
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert errors == [], [r.getMessage() for r in errors]
    assert any("was deleted with its project" in r.getMessage() for r in caplog.records)
    # Nothing of alpha was written back, and the worker goes on with other gates.
    alpha_id = uuid.UUID(deleted.json()["id"])
    assert rows_of(sessions, alpha_id) == dict.fromkeys(OF_PROJECT, 0)
    other = submit(beta, bundle_of(tool_cases_project(tmp_path / "b", cases=2)))
    if isinstance(engine, SlowBuild):
        engine.slow = False
    assert worker.run_once()
    assert beta.get(f"/v1/gates/{other}").json()["status"] == "passed"


def test_a_queued_gate_of_a_deleted_project_is_never_claimed(
    client: TestClient, worker: Worker, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    alpha = as_token(client, project_token(client, "alpha", ["submit", "read"]))
    submit(alpha, bundle_of(calculator_project(tmp_path / "a", failing=False)))
    r = client.delete("/v1/projects/alpha")
    assert r.status_code == 200 and r.json()["counts"]["gates_stopped"] == 1
    assert worker.run_once() is False
    assert sandbox.runs == []


# -- races with the deletion's transaction ---------------------------------------------------


def admin_principal(sessions: sessionmaker[Session]) -> Principal:
    with session_scope(sessions) as s:
        who = authenticate(s, ADMIN_TOKEN)
    assert isinstance(who, Principal)
    return who


def backends_waiting_on_locks(database_url: str, like: str) -> int:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s",
            (like,),
        ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def uncommitted_deletion(
    sessions: sessionmaker[Session], name: str
) -> Iterator[Callable[[], None]]:
    """The deletion of ``name`` done and held open; the context's value commits it."""
    session = sessions()
    try:
        deletion.delete_project(session, admin_principal(sessions), name)
        yield session.commit
    finally:
        session.rollback()
        session.close()


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    return thread, answers


def test_a_token_used_while_its_project_is_being_deleted_gets_401_not_500(
    client: TestClient, sessions: sessionmaker[Session], database_url: str
) -> None:
    # Never used: authenticating it writes its last_used_at, on the row being deleted.
    alpha = as_token(client, project_token(client, "alpha", ["read"]))
    with uncommitted_deletion(sessions, "alpha") as commit:
        thread, answers = in_thread(lambda: alpha.get("/v1/gates"))
        wait_for(
            "the request's wait",
            lambda: backends_waiting_on_locks(database_url, "UPDATE api_tokens%") == 1,
        )
        commit()
        thread.join(timeout=30)
    (answer,) = answers
    assert answer.status_code == 401, answer.text


def test_a_submission_while_its_project_is_being_deleted_gets_404_not_500(
    client: TestClient, sessions: sessionmaker[Session], database_url: str, tmp_path: Path
) -> None:
    alpha = as_token(client, project_token(client, "alpha", ["submit", "read"]))
    assert alpha.get("/v1/gates").status_code == 200  # its last use is written now
    data = bundle_of(calculator_project(tmp_path / "a", failing=False))
    with uncommitted_deletion(sessions, "alpha") as commit:
        thread, answers = in_thread(
            lambda: alpha.post("/v1/gates", files={"bundle": ("b.tgz", data)})
        )
        wait_for(
            "the submission's wait",
            lambda: backends_waiting_on_locks(database_url, "SELECT id FROM projects%") == 1,
        )
        commit()
        thread.join(timeout=30)
    (answer,) = answers
    assert answer.status_code == 404, answer.text
    assert "deleted" in answer.json()["detail"]
    with session_scope(sessions) as s:
        assert s.execute(text("SELECT count(*) FROM gates")).scalar_one() == 0


def test_a_deadlock_with_a_writer_is_retried_not_a_500(
    client: TestClient,
    sessions: sessionmaker[Session],
    database_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A writer that locks a gate and then its job (as an API cancel does) while the deletion
    holds the job and waits for the gate: Postgres ends the deletion's statement (it waited
    first), the deletion's savepoint rolls back, and its next attempt succeeds."""
    alpha = as_token(client, project_token(client, "alpha", ["submit", "read"]))
    gate_id = submit(alpha, bundle_of(calculator_project(tmp_path / "a", failing=False)))
    with psycopg.connect(libpq_url(database_url)) as writer:
        writer.execute("SELECT 1 FROM gates WHERE id = %s FOR UPDATE", (gate_id,))
        thread, answers = in_thread(lambda: client.delete("/v1/projects/alpha"))
        wait_for(
            "the deletion's wait for the gate",
            lambda: backends_waiting_on_locks(database_url, "DELETE FROM gates%") == 1,
        )
        # Waits for the deletion's lock on the job: a cycle, which Postgres breaks.
        writer.execute("SELECT 1 FROM jobs WHERE gate_id = %s FOR UPDATE", (gate_id,))
        writer.commit()
    thread.join(timeout=30)
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["counts"]["gates"] == 1
    assert any("deadlock (attempt 1 of 3)" in r.getMessage() for r in caplog.records)
    assert project_id(sessions, "alpha") is None


def test_the_deletion_is_one_transaction(
    client: TestClient,
    sessions: sessionmaker[Session],
    tenants: dict[str, Tenant],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failure at the last statement leaves every row of the project where it was."""
    alpha = tenants["alpha"]
    before = rows_of(sessions, alpha.id)
    real = deletion._delete_bundles

    def failing(session: Session, shas: Sequence[str]) -> tuple[int, int]:
        real(session, set(shas))
        raise RuntimeError("the database went away")

    monkeypatch.setattr(deletion, "_delete_bundles", failing)
    c = TestClient(client.app, headers=bearer(ADMIN_TOKEN), raise_server_exceptions=False)
    assert c.delete("/v1/projects/alpha").status_code == 500
    assert rows_of(sessions, alpha.id) == before
    assert alpha.api.get("/v1/gates").status_code == 200

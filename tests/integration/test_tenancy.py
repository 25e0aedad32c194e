"""Tokens and projects: every /v1 route needs a token, and a token sees only its project.

Two projects, `alpha` and `beta`, each with a submit+read token; every route is tried with
the other project's ids, which must answer 404 (never 403: another project's ids do not
exist for you).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gate_service.app_state import state_of
from gate_service.auth.brakes import FailureLimiter
from gate_service.auth.tokens import token_digest
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.models import ApiToken, AuditEvent, utcnow
from gate_service.worker.handler import WorkerContext
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN, as_token, project_token
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.sandbox import FakeSandbox

# A fixed unknown id: the test ids stay the same in every process (pytest-xdist compares them).
NOBODY = uuid.UUID(int=0xDEAD)
ROUTES = [
    ("GET", "/v1/gates"),
    ("POST", "/v1/gates"),
    ("GET", f"/v1/gates/{NOBODY}"),
    ("POST", f"/v1/gates/{NOBODY}/cancel"),
    ("GET", f"/v1/runs/{NOBODY}"),
    ("POST", "/v1/projects"),
    ("DELETE", "/v1/projects/default"),
    ("POST", "/v1/projects/default/tokens"),
    ("GET", "/v1/projects/default/tokens"),
    ("DELETE", f"/v1/tokens/{NOBODY}"),
    ("GET", "/v1/audit"),
    ("GET", "/v1/whoami"),
]


@pytest.fixture
def tenants(client: TestClient) -> dict[str, TestClient]:
    return {
        name: as_token(client, project_token(client, name, ["submit", "read"]))
        for name in ("alpha", "beta")
    }


def submitted(c: TestClient, data: bytes, key: str | None = None) -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else {}
    r = c.post("/v1/gates", files={"bundle": ("b.tgz", data)}, headers=headers)
    assert r.status_code in (200, 202), r.text
    return dict(r.json())


def judged_gate(
    c: TestClient, data: bytes, settings: Settings, sessions: sessionmaker[Session]
) -> dict[str, Any]:
    gate = submitted(c, data)
    ctx = WorkerContext(settings, sessions, FakeSandbox(), threading.Event())
    assert Worker(ctx, name="w").run_once()
    return dict(c.get(f"/v1/gates/{gate['id']}").json())


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("token", [None, "gate_not-a-real-token", "Basic abc"])
def test_every_route_needs_a_valid_bearer_token(
    client: TestClient, method: str, path: str, token: str | None
) -> None:
    c = TestClient(client.app, headers={"Authorization": token} if token else {})
    if token and not token.startswith("Basic"):
        c = as_token(client, token)
    r = c.request(method, path)
    assert r.status_code == 401, (method, path, r.text)
    assert r.json()["error"] == "Unauthorized"
    assert r.headers["WWW-Authenticate"] == "Bearer"


def test_health_needs_no_token(client: TestClient) -> None:
    c = as_token(client, None)
    assert c.get("/healthz").status_code == 200
    assert c.get("/readyz").status_code == 200


def test_another_projects_gate_runs_and_cancel_are_404(
    tenants: dict[str, TestClient],
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    alpha, beta = tenants["alpha"], tenants["beta"]
    gate = judged_gate(
        alpha, bundle_of(calculator_project(tmp_path / "p", failing=True)), settings, sessions
    )
    run_id = gate["cases"][0]["agent_run_ids"][0]
    assert alpha.get(f"/v1/runs/{run_id}").status_code == 200
    for method, path in [
        ("GET", f"/v1/gates/{gate['id']}"),
        ("GET", f"/v1/gates/{gate['id']}?wait=1"),
        ("POST", f"/v1/gates/{gate['id']}/cancel"),
        ("GET", f"/v1/runs/{run_id}"),
    ]:
        r = beta.request(method, path)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"] == "NotFound"
    assert alpha.get("/v1/gates").json()["total"] == 1
    assert beta.get("/v1/gates").json() == {"items": [], "total": 0, "limit": 50, "offset": 0}


def test_cancel_of_another_projects_queued_gate_leaves_it_queued(
    tenants: dict[str, TestClient], tmp_path: Path
) -> None:
    gate = submitted(tenants["alpha"], bundle_of(calculator_project(tmp_path / "p", failing=False)))
    assert tenants["beta"].post(f"/v1/gates/{gate['id']}/cancel").status_code == 404
    assert tenants["alpha"].get(f"/v1/gates/{gate['id']}").json()["status"] == "queued"
    assert tenants["alpha"].post(f"/v1/gates/{gate['id']}/cancel").status_code == 200


def test_idempotency_keys_are_per_project(tenants: dict[str, TestClient], tmp_path: Path) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    other = bundle_of(calculator_project(tmp_path / "q", failing=True))
    a = submitted(tenants["alpha"], data, key="release-1")
    # The same key in another project is another gate, and a different bundle is no conflict
    # there: nothing of alpha's gate leaks to beta.
    b = submitted(tenants["beta"], other, key="release-1")
    assert a["id"] != b["id"]
    again = tenants["alpha"].post(
        "/v1/gates", files={"bundle": ("b.tgz", other)}, headers={"Idempotency-Key": "release-1"}
    )
    assert again.status_code == 409
    assert b["id"] not in again.text


def test_scopes_decide_what_a_token_may_do(client: TestClient, tmp_path: Path) -> None:
    reader = as_token(client, project_token(client, "gamma", ["read"]))
    submitter = as_token(client, project_token(client, "gamma", ["submit"]))
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    refused = reader.post("/v1/gates", files={"bundle": ("b.tgz", data)})
    assert refused.status_code == 403 and "submit scope" in refused.json()["detail"]
    gate = submitted(submitter, data)
    assert submitter.get(f"/v1/gates/{gate['id']}").status_code == 403
    assert reader.get(f"/v1/gates/{gate['id']}").status_code == 200
    assert reader.post(f"/v1/gates/{gate['id']}/cancel").status_code == 403
    for c in (reader, submitter):
        assert c.get("/v1/audit").status_code == 403
        assert c.get("/v1/projects/gamma/tokens").status_code == 403


def test_tokens_are_shown_once_stored_hashed_listed_without_values(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    assert client.post("/v1/projects", json={"name": "delta"}).status_code == 201
    created = client.post(
        "/v1/projects/delta/tokens", json={"scopes": ["read"], "name": "ci", "expires_in_days": 7}
    )
    assert created.status_code == 201
    body = created.json()
    token = body["token"]
    assert token.startswith("gate_") and len(token) >= 40
    with session_scope(sessions) as s:
        stored = s.get_one(ApiToken, uuid.UUID(body["id"]))
        assert stored.token_sha256 == token_digest(token)
        assert token not in repr(vars(stored))
    listed = client.get("/v1/projects/delta/tokens").json()["items"]
    assert [t["id"] for t in listed] == [body["id"]]
    assert "token" not in listed[0] and token not in str(listed)
    assert as_token(client, token).get("/v1/gates").status_code == 200


def test_an_expired_token_gets_401(client: TestClient, sessions: sessionmaker[Session]) -> None:
    token = project_token(client, "eps", ["read"])
    c = as_token(client, token)
    assert c.get("/v1/gates").status_code == 200
    with session_scope(sessions) as s:
        s.execute(
            update(ApiToken)
            .where(ApiToken.token_sha256 == token_digest(token))
            .values(expires_at=utcnow())
        )
    r = c.get("/v1/gates")
    assert (r.status_code, r.json()["detail"]) == (401, "the token has expired")


def test_revoking_answers_401_at_once(client: TestClient) -> None:
    assert client.post("/v1/projects", json={"name": "zeta"}).status_code == 201
    body = client.post("/v1/projects/zeta/tokens", json={"scopes": ["read"]}).json()
    c = as_token(client, body["token"])
    assert c.get("/v1/gates").status_code == 200
    revoked = client.delete(f"/v1/tokens/{body['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    r = c.get("/v1/gates")
    assert (r.status_code, r.json()["detail"]) == (401, "the token was revoked")


def test_project_admins_manage_only_their_own_project(client: TestClient) -> None:
    alpha_admin = as_token(client, project_token(client, "alpha", ["admin"]))
    beta_token = client.post("/v1/projects", json={"name": "beta"})
    assert beta_token.status_code == 201
    beta_read = client.post("/v1/projects/beta/tokens", json={"scopes": ["read"]}).json()
    # Another project's tokens and ids are 404, as if they did not exist.
    assert alpha_admin.get("/v1/projects/beta/tokens").status_code == 404
    assert alpha_admin.post("/v1/projects/beta/tokens", json={"scopes": ["read"]}).status_code == (
        404
    )
    assert alpha_admin.delete(f"/v1/tokens/{beta_read['id']}").status_code == 404
    assert as_token(client, beta_read["token"]).get("/v1/gates").status_code == 200
    # Its own project's tokens it manages; new projects only the `default` admins make.
    assert alpha_admin.post("/v1/projects/alpha/tokens", json={"scopes": ["read"]}).status_code == (
        201
    )
    assert alpha_admin.post("/v1/projects", json={"name": "mine"}).status_code == 403


@pytest.mark.parametrize(
    "body",
    [
        {"name": "Has Spaces"},
        {"name": ""},
        {"name": "x" * 65},
        {"name": "-dash"},
        {"name": "ok", "extra": 1},
        {"name": "trailing-newline\n"},  # "$" matches before a final newline: fullmatch
    ],
)
def test_bad_project_names_are_refused(client: TestClient, body: dict[str, Any]) -> None:
    r = client.post("/v1/projects", json=body)
    assert r.status_code in (400, 422), r.text
    assert set(r.json()) == {"error", "detail", "problems"}


def test_repeated_failures_from_one_client_get_429(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    limit = state_of(client.app).part(FailureLimiter).limit
    bad = as_token(client, "gate_guess")
    for _ in range(limit):
        assert bad.get("/v1/gates").status_code == 401
    r = bad.get("/v1/gates")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    # The brake is per client and holds even for a good token from that client.
    assert client.get("/v1/gates").status_code == 429
    with session_scope(sessions) as s:
        rejected = s.scalars(select(AuditEvent).where(AuditEvent.action == "token.rejected"))
        assert len(list(rejected)) == limit


def test_audit_records_who_did_what(
    client: TestClient, tenants: dict[str, TestClient], tmp_path: Path
) -> None:
    gate = submitted(tenants["alpha"], bundle_of(calculator_project(tmp_path / "p", failing=False)))
    tenants["alpha"].post(f"/v1/gates/{gate['id']}/cancel")
    actions = [e["action"] for e in client.get("/v1/audit").json()["items"]]
    for action in ("project.created", "token.created", "gate.submitted", "gate.cancelled"):
        assert action in actions
    alpha_admin = as_token(client, project_token(client, "alpha", ["admin"]))
    own = alpha_admin.get("/v1/audit").json()["items"]
    assert own and all(e["project_id"] == own[0]["project_id"] for e in own)
    assert "project.created" not in [e["action"] for e in own]


def test_the_bootstrap_token_is_the_default_projects_admin(client: TestClient) -> None:
    listed = client.get("/v1/projects/default/tokens").json()["items"]
    assert [(t["name"], t["scopes"]) for t in listed] == [("bootstrap", ["admin"])]
    assert ADMIN_TOKEN not in str(listed)


def test_first_start_without_a_bootstrap_token_makes_one_shown_once(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gate_service.db import make_engine, make_sessionmaker
    from gate_service.main import ADMIN_TOKEN_FILE, bootstrap_admin

    settings = Settings(database_url=database_url, data_dir=tmp_path / "data")
    engine = make_engine(database_url)
    try:
        factory = make_sessionmaker(engine)
        bootstrap_admin(settings, factory)
        path = tmp_path / "data" / ADMIN_TOKEN_FILE
        token = path.read_text().strip()
        assert path.stat().st_mode & 0o777 == 0o600
        assert token in capsys.readouterr().err
        bootstrap_admin(settings, factory)  # a later start: nothing new, nothing printed
        assert capsys.readouterr().err == ""
        assert path.read_text().strip() == token
        with session_scope(factory) as s:
            (stored,) = s.scalars(select(ApiToken)).all()
            assert stored.token_sha256 == token_digest(token) and stored.scopes == ["admin"]
    finally:
        engine.dispose()

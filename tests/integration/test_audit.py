"""The audit trail: every recorded action names the token that acted, and GET /v1/audit
filters by action and time. Also PATCH /v1/projects/{name} (retention), recorded there."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gate_service.db import session_scope
from tests.fixtures.auth import as_token
from tests.fixtures.projects import bundle_of, calculator_project


def new_token(admin: TestClient, project: str, scopes: list[str]) -> tuple[str, str]:
    """(id, token) of a new token of ``project``, made if needed."""
    made = admin.post("/v1/projects", json={"name": project})
    assert made.status_code in (201, 409), made.text
    r = admin.post(f"/v1/projects/{project}/tokens", json={"scopes": scopes})
    assert r.status_code == 201, r.text
    return str(r.json()["id"]), str(r.json()["token"])


def admin_token_id(client: TestClient) -> str:
    return str(client.get("/v1/projects/default/tokens").json()["items"][0]["id"])


def events(c: TestClient, **params: Any) -> list[dict[str, Any]]:
    r = c.get("/v1/audit", params={"limit": 500, **params})
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def only(items: list[dict[str, Any]], action: str) -> dict[str, Any]:
    found = [e for e in items if e["action"] == action]
    assert len(found) == 1, (action, items)
    return found[0]


def project_id(sessions: sessionmaker[Session], name: str) -> str:
    with session_scope(sessions) as s:
        return str(s.execute(text("SELECT id FROM projects WHERE name = :n"), {"n": name}).scalar())


def test_each_action_is_recorded_with_the_acting_token(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    admin_id = admin_token_id(client)
    ci_id, ci = new_token(client, "shop", ["submit", "read"])
    doomed_id, doomed = new_token(client, "shop", ["read"])
    shop = project_id(sessions, "shop")
    submitter = as_token(client, ci)
    r = submitter.post(
        "/v1/gates",
        files={"bundle": ("b.tgz", bundle_of(calculator_project(tmp_path / "p", failing=False)))},
    )
    assert r.status_code == 202, r.text
    gate = r.json()["id"]
    assert submitter.post(f"/v1/gates/{gate}/cancel").status_code == 200
    assert client.delete(f"/v1/tokens/{doomed_id}").status_code == 200
    assert as_token(client, doomed).get("/v1/gates").status_code == 401
    assert as_token(client, "gate_nobody-knows-this").get("/v1/gates").status_code == 401

    items = events(client)
    submitted = only(items, "gate.submitted")
    assert (submitted["project_id"], submitted["token_id"]) == (shop, ci_id)
    assert submitted["detail"]["gate"] == gate
    cancelled = only(items, "gate.cancelled")
    assert (cancelled["project_id"], cancelled["token_id"]) == (shop, ci_id)
    created = [e for e in items if e["action"] == "token.created"]
    assert {e["detail"]["token"] for e in created} == {ci_id, doomed_id}
    assert {(e["project_id"], e["token_id"]) for e in created} == {(shop, admin_id)}
    revoked = only(items, "token.revoked")
    assert (revoked["project_id"], revoked["token_id"]) == (shop, admin_id)
    assert revoked["detail"]["token"] == doomed_id
    rejected = {e["detail"]["why"]: e for e in items if e["action"] == "token.rejected"}
    assert (rejected["revoked"]["project_id"], rejected["revoked"]["token_id"]) == (
        shop,
        doomed_id,
    )
    # An unknown token belongs to no project, and its value is never stored.
    assert (rejected["unknown"]["project_id"], rejected["unknown"]["token_id"]) == (None, None)
    assert "nobody-knows-this" not in str(items) and ci not in str(items)


def test_action_and_since_filter_the_audit(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    new_token(client, "shop", ["read"])
    new_token(client, "mill", ["read"])
    assert as_token(client, "gate_unknown").get("/v1/gates").status_code == 401
    with session_scope(sessions) as s:
        s.execute(
            text(
                "UPDATE audit_events SET at = now() - interval '2 days' "
                "WHERE action = 'project.created'"
            )
        )

    assert {e["action"] for e in events(client, action="token.created")} == {"token.created"}
    assert len(events(client, action="token.created")) == 2
    both = events(client, action=["token.created", "token.rejected"])
    assert sorted(e["action"] for e in both) == ["token.created", "token.created", "token.rejected"]
    assert events(client, action="no.such.action") == []

    day_ago = datetime.now(UTC) - timedelta(days=1)
    recent = events(client, since=day_ago.isoformat())
    assert recent and "project.created" not in {e["action"] for e in recent}
    assert all(datetime.fromisoformat(e["at"]) >= day_ago for e in recent)
    # Without an offset the time is UTC.
    naive = day_ago.replace(tzinfo=None).isoformat()
    assert events(client, since=naive) == recent
    older = events(client, since=(day_ago - timedelta(days=2)).isoformat())
    assert len([e for e in older if e["action"] == "project.created"]) == 2
    assert events(client, action="project.created", since=day_ago.isoformat()) == []
    assert events(client, since=(datetime.now(UTC) + timedelta(days=1)).isoformat()) == []


def test_a_project_admin_filters_only_its_own_trail(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    _id, shop_admin = new_token(client, "shop", ["admin"])
    new_token(client, "mill", ["read"])
    own = as_token(client, shop_admin)
    created = events(own, action="token.created")
    assert len(created) == 1 and created[0]["project_id"] == project_id(sessions, "shop")
    assert events(own, action="project.created") == []


@pytest.mark.parametrize(
    "query",
    [
        "action=",
        "action=Token.Created",
        "action=a%00b",
        "action=" + "a" * 65,
        "action=%F0%9F%92%A5",
        "since=yesterday",
        "since=2026-13-01",
        "since=99999-01-01T00:00:00",
        "since=%00",
    ],
)
def test_bad_filters_answer_422_in_the_error_shape(client: TestClient, query: str) -> None:
    r = client.get(f"/v1/audit?{query}")
    assert r.status_code == 422, r.text
    assert set(r.json()) == {"error", "detail", "problems"}


def test_extreme_but_valid_since_values_answer(client: TestClient) -> None:
    for since in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-12:00", "2026-01-01"):
        assert client.get("/v1/audit", params={"since": since}).status_code == 200, since


def test_patch_sets_a_projects_retention(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    admin_id = admin_token_id(client)
    assert client.post("/v1/projects", json={"name": "shop", "retention_days": 30}).status_code == (
        201
    )
    r = client.patch("/v1/projects/shop", json={"retention_days": 7})
    assert r.status_code == 200, r.text
    assert (r.json()["name"], r.json()["retention_days"]) == ("shop", 7)
    with session_scope(sessions) as s:
        stored = s.execute(text("SELECT retention_days FROM projects WHERE name = 'shop'"))
        assert stored.scalar() == 7
    updated = only(events(client, action="project.updated"), "project.updated")
    assert updated["project_id"] == project_id(sessions, "shop")
    assert updated["token_id"] == admin_id
    assert updated["detail"] == {"project": "shop", "retention_days": [30, 7]}


def test_patch_is_for_admins_of_that_project_or_of_default(client: TestClient) -> None:
    own_id, shop_admin = new_token(client, "shop", ["admin"])
    _rid, shop_reader = new_token(client, "shop", ["submit", "read"])
    new_token(client, "mill", ["read"])
    admin = as_token(client, shop_admin)
    r = admin.patch("/v1/projects/shop", json={"retention_days": 3})
    assert r.status_code == 200 and r.json()["retention_days"] == 3
    assert only(events(admin, action="project.updated"), "project.updated")["token_id"] == own_id
    # Another project's is 404, as if it did not exist; so is one that does not exist.
    for name in ("mill", "default", "nope"):
        r = admin.patch(f"/v1/projects/{name}", json={"retention_days": 3})
        assert (r.status_code, r.json()["error"]) == (404, "NotFound"), name
    assert client.get("/v1/audit", params={"action": "project.updated"}).json()["items"][0][
        "detail"
    ]["project"] == ("shop")
    r = as_token(client, shop_reader).patch("/v1/projects/shop", json={"retention_days": 3})
    assert r.status_code == 403


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"retention_days": 0},
        {"retention_days": 3651},
        {"retention_days": "a week"},
        {"retention_days": 7, "name": "renamed"},
        [],
    ],
)
def test_patch_refuses_bad_bodies(client: TestClient, body: Any) -> None:
    assert client.post("/v1/projects", json={"name": "shop"}).status_code == 201
    r = client.patch("/v1/projects/shop", json=body)
    assert r.status_code == 422, r.text
    assert set(r.json()) == {"error", "detail", "problems"}
    assert client.patch(f"/v1/projects/{uuid.uuid4()}", json={"retention_days": 1}).status_code == (
        404
    )

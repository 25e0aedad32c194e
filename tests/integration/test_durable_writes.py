"""A write is durable before it is answered (trust-2, item 7).

Through a real `gate api` (uvicorn, a real Postgres): a client that acts on an answer at once
must see what the answer said. When the request's transaction committed after the response
was sent, a token revoked by a `204` still authenticated for a moment, and a token created
by a `201` could be unknown on its first use. A commit that fails must answer `5xx`, never
the `2xx` of a write that was lost.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gate_service import deps
from gate_service.config import Settings
from gate_service.main import create_app
from tests.e2e.conftest import running
from tests.fixtures.auth import ADMIN_TOKEN, bearer

ROUNDS = 100


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[str]:
    # Each use of a revoked token is a failed authentication: room for all of them.
    limit = str(10 * ROUNDS)
    with running(
        "api", tmp_path, GATE_DATABASE_URL=database_url, GATE_AUTH_FAILURE_LIMIT=limit
    ) as api:
        yield api.url


def test_a_revoked_token_fails_at_once_and_a_new_one_works_at_once(api: str) -> None:
    admin = httpx.Client(base_url=api, headers=bearer(ADMIN_TOKEN), timeout=30)
    user = httpx.Client(base_url=api, timeout=30)
    try:
        assert admin.post("/v1/projects", json={"name": "shop"}).status_code == 201
        first_use, after_revoke = [], []
        for _ in range(ROUNDS):
            made = admin.post("/v1/projects/shop/tokens", json={"scopes": ["read"]})
            assert made.status_code == 201, made.text
            token, token_id = made.json()["token"], made.json()["id"]
            first_use.append(user.get("/v1/gates", headers=bearer(token)).status_code)
            assert admin.delete(f"/v1/tokens/{token_id}").status_code in (200, 204)
            after_revoke.append(user.get("/v1/gates", headers=bearer(token)).status_code)
    finally:
        admin.close()
        user.close()
    assert first_use == [200] * ROUNDS
    assert after_revoke == [401] * ROUNDS


def test_a_commit_that_fails_answers_5xx(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request's commit fails (the server went away, say): the answer is 500, not 201."""

    @contextmanager
    def commit_fails(factory: sessionmaker[Session]) -> Iterator[Session]:
        session = factory()
        try:
            yield session
            session.rollback()
            raise OperationalError("COMMIT", {}, Exception("server closed the connection"))
        finally:
            session.close()

    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        client.headers.update(bearer(ADMIN_TOKEN))
        monkeypatch.setattr(deps, "session_scope", commit_fails)  # the request's own session
        answer = client.post("/v1/projects", json={"name": "lost"})
        monkeypatch.undo()
        assert answer.status_code == 500, answer.text
        assert answer.json()["error"] == "InternalError"
        # Nothing was stored: the name is still free.
        assert client.post("/v1/projects", json={"name": "lost"}).status_code == 201

"""No 5xx from input: each input that once answered a text/plain 500 answers a 4xx in the one
error shape, and what does fail inside answers 500 in that shape with a request id and nothing
of the host (issue 9, item 5). Through the real app, on a real Postgres."""

import logging
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gate_service.db import session_scope
from tests.fixtures.projects import bundle_of, calculator_project

NOT_A_UUID = "x"


def assert_error_shape(response: Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "detail", "problems"}, body
    assert isinstance(body["detail"], str) and body["detail"]
    assert re.fullmatch(r"[0-9a-f]{16}", response.headers["X-Request-ID"])
    return dict(body)


@pytest.fixture
def bundle(tmp_path: Path) -> bytes:
    return bundle_of(calculator_project(tmp_path / "p", failing=False))


def submit(client: TestClient, bundle: bytes, **fields: str) -> Response:
    return client.post("/v1/gates", files={"bundle": ("p.tgz", bundle)}, data=fields)


def test_labels_nested_3000_deep_is_400(client: TestClient, bundle: bytes) -> None:
    for labels in ("[" * 3000 + "]" * 3000, '{"a": ' + "[" * 3000 + "]" * 3000 + "}"):
        body = assert_error_shape(submit(client, bundle, labels=labels), 400)
        assert "nest more than 8 levels" in str(body["detail"])
    nested_ok = '{"a": {"b": {"c": [1, [2, [3]]]}}}'
    assert submit(client, bundle, labels=nested_ok).status_code == 202


def test_a_lone_surrogate_in_labels_is_400(client: TestClient, bundle: bytes) -> None:
    for labels in ('{"a": "\\ud800"}', '{"\\udfff": "x"}', '{"a": ["ok", "\\ud800x"]}'):
        body = assert_error_shape(submit(client, bundle, labels=labels), 400)
        assert "surrogate" in str(body["detail"])
    # A proper pair is one character, and is stored as it is.
    pair = submit(client, bundle, labels='{"emoji": "\\ud83d\\ude00"}')
    assert pair.status_code == 202
    assert pair.json()["labels"] == {"emoji": "\U0001f600"}


def test_labels_that_postgres_cannot_store_are_400(client: TestClient, bundle: bytes) -> None:
    for labels, said in (
        ('{"a": "x\\u0000y"}', "NUL"),
        ('{"a": NaN}', "NaN"),
        ('{"a": Infinity}', "Infinity"),
        ('{"a": 1e400}', "too large"),
        ('{"a": 1', "JSON object"),
        ("[1, 2]", "JSON object"),
    ):
        body = assert_error_shape(submit(client, bundle, labels=labels), 400)
        assert said in str(body["detail"]), (labels, body)


def test_a_nul_in_a_label_filter_is_400(client: TestClient) -> None:
    for label in ("a=\x00", "a\x00=b", "\x00"):
        body = assert_error_shape(client.get("/v1/gates", params={"label": label}), 400)
        assert "NUL" in str(body["detail"])
    assert client.get("/v1/gates", params={"label": "a=b"}).status_code == 200


def test_non_uuid_ids_are_422_in_every_id_route(client: TestClient) -> None:
    for method, path in (
        ("GET", f"/v1/gates/{NOT_A_UUID}"),
        ("POST", f"/v1/gates/{NOT_A_UUID}/cancel"),
        ("GET", f"/v1/runs/{NOT_A_UUID}"),
        ("DELETE", f"/v1/tokens/{NOT_A_UUID}"),
        ("GET", "/v1/gates/%00"),
        ("GET", "/v1/runs/" + "f" * 5000),
    ):
        body = assert_error_shape(client.request(method, path), 422)
        assert "UUID" in str(body["detail"]), (method, path)


def test_huge_offset_and_limit_are_422(client: TestClient) -> None:
    for params in (
        {"offset": str(10**30)},
        {"offset": str(2**63)},
        {"offset": "1000001"},
        {"limit": str(10**30)},
        {"limit": "0"},
        {"offset": "-1"},
    ):
        assert_error_shape(client.get("/v1/gates", params=params), 422)
        assert_error_shape(client.get("/v1/audit", params=params), 422)
    assert client.get("/v1/gates", params={"offset": "1000000"}).status_code == 200


def test_an_empty_or_oversized_idempotency_key_is_400(client: TestClient, bundle: bytes) -> None:
    for key in ("", "   ", "k" * 201):
        response = client.post(
            "/v1/gates", files={"bundle": ("p.tgz", bundle)}, headers={"Idempotency-Key": key}
        )
        body = assert_error_shape(response, 400)
        assert "Idempotency-Key" in str(body["detail"])
    ok = client.post(
        "/v1/gates", files={"bundle": ("p.tgz", bundle)}, headers={"Idempotency-Key": "k" * 200}
    )
    assert ok.status_code == 202


def test_every_answer_carries_a_fresh_request_id(client: TestClient) -> None:
    ids = {client.get("/healthz").headers["X-Request-ID"] for _ in range(3)}
    ids.add(client.get("/v1/gates/nope").headers["X-Request-ID"])
    assert len(ids) == 4
    # Made by the service, never taken from the client (it names a line in the service's log).
    sent = client.get("/healthz", headers={"X-Request-ID": "mine"})
    assert sent.headers["X-Request-ID"] != "mine"


def test_an_internal_failure_is_500_in_the_error_shape_without_sql_or_paths(
    client: TestClient,
    sessions: sessionmaker[Session],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Break the database under the running app: the next read fails in SQL, for real.
    with session_scope(sessions) as s:
        s.execute(text("ALTER TABLE gates RENAME TO gates_gone"))
    quiet = TestClient(client.app, headers=dict(client.headers), raise_server_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="gate_service.errors"):
        response = quiet.get("/v1/gates")
    body = assert_error_shape(response, 500)
    request_id = response.headers["X-Request-ID"]
    assert body == {
        "error": "InternalError",
        "detail": f"the service failed; quote request id {request_id}",
        "problems": [],
    }
    for leak in ("SELECT", "gates", "psycopg", "sqlalchemy", "Traceback", "/"):
        assert leak not in response.text, leak
    # The log keeps the details, under the same id.
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged, caplog.text
    assert logged[0].exc_info is not None
    assert "UndefinedTable" in caplog.text and "SELECT" in caplog.text


def test_text_postgres_cannot_store_is_refused_in_admin_routes(client: TestClient) -> None:
    for raw in (
        b'{"scopes": ["read"], "name": "a\\u0000"}',
        b'{"scopes": ["read"], "name": "\\ud800"}',
    ):
        response = client.post(
            "/v1/projects/default/tokens",
            content=raw,
            headers={"Content-Type": "application/json"},
        )
        assert_error_shape(response, 422)
    for method, path in (
        ("GET", "/v1/projects/a%00b/tokens"),
        ("POST", "/v1/projects/a%00b/tokens"),
        ("GET", "/v1/projects/a%ED%A0%80b/tokens"),
    ):
        response = client.request(method, path, json={"scopes": ["read"]})
        assert_error_shape(response, 404)

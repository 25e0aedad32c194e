"""`gate admin` and `gate submit` are thin clients of the API, with GATE_TOKEN or --token."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gate_service.cli import main
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.live import live_server  # noqa: F401 (fixture)
from tests.fixtures.projects import calculator_project


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_admin_makes_a_project_and_a_token_that_submits(
    live_server: tuple[str, int],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    url = "http://{}:{}".format(*live_server)
    monkeypatch.setenv("GATE_TOKEN", ADMIN_TOKEN)
    code, out, _ = run(capsys, "admin", "--url", url, "project-create", "shop")
    assert code == 0 and json.loads(out)["name"] == "shop"
    code, out, _ = run(
        capsys, "admin", "--url", url, "token-create", "shop", "--scope", "submit", "--scope",
        "read",
    )  # fmt: skip
    created = json.loads(out)
    assert code == 0 and created["scopes"] == ["read", "submit"]
    code, out, _ = run(capsys, "admin", "--url", url, "token-list", "shop")
    assert [t["id"] for t in json.loads(out)["items"]] == [created["id"]]
    assert created["token"] not in out

    project = calculator_project(tmp_path / "p", failing=False)
    monkeypatch.delenv("GATE_TOKEN")
    code, out, _ = run(
        capsys, "submit", str(project), "--no-wait", "--url", url, "--token", created["token"]
    )
    assert code == 0 and "queued" in out

    code, out, _ = run(capsys, "admin", "--url", url, "--token", ADMIN_TOKEN, "token-revoke",
                       created["id"])  # fmt: skip
    assert code == 0 and json.loads(out)["revoked_at"]
    code, _, err = run(capsys, "submit", str(project), "--url", url, "--token", created["token"])
    assert code == 2 and f"the token {created['token'][:8]}… was revoked" in err


def test_submit_without_a_token_is_refused_with_exit_2(
    live_server: tuple[str, int],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.delenv("GATE_TOKEN", raising=False)
    url = "http://{}:{}".format(*live_server)
    project = calculator_project(tmp_path / "p", failing=False)
    code, _, err = run(capsys, "submit", str(project), "--url", url)
    assert code == 2 and "no token" in err and "Set GATE_TOKEN (or pass --token)" in err


def test_admin_sets_and_lists_a_projects_model_routes(
    live_server: tuple[str, int],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "http://{}:{}".format(*live_server)
    monkeypatch.setenv("GATE_TOKEN", ADMIN_TOKEN)
    assert run(capsys, "admin", "--url", url, "project-create", "routed")[0] == 0
    code, out, err = run(
        capsys, "admin", "--url", url, "routes-set", "routed",
        "--route", "corp/*=http://llm-proxy:4000/v1#CORP_KEY",
        "--route", "local/*=http://127.0.0.1:8000/v1", "--responses-api", "local/*",
    )  # fmt: skip
    assert code == 0, err
    expected = [
        {"pattern": "corp/*", "api_base": "http://llm-proxy:4000/v1", "key_secret": "CORP_KEY",
         "responses_api": False},
        {"pattern": "local/*", "api_base": "http://127.0.0.1:8000/v1", "key_secret": None,
         "responses_api": True},
    ]  # fmt: skip
    assert json.loads(out)["routes"] == expected
    code, out, _ = run(capsys, "admin", "--url", url, "routes", "routed")
    assert code == 0 and json.loads(out)["routes"] == expected
    # What the API refuses comes back as exit 2 with its reason.
    metadata = "m/*=http://169.254.169.254/"
    code, _, err = run(capsys, "admin", "--url", url, "routes-set", "routed", "--route", metadata)
    assert code == 2 and "link-local" in err
    code, _, err = run(capsys, "admin", "--url", url, "routes-set", "routed", "--route", "nope")
    assert code == 2 and "PATTERN=URL" in err
    code, _, err = run(
        capsys, "admin", "--url", url, "routes-set", "routed",
        "--route", "a/*=http://127.0.0.1:8000/v1", "--responses-api", "b/*",
    )  # fmt: skip
    assert code == 2 and "names no --route pattern: b/*" in err
    code, out, _ = run(capsys, "admin", "--url", url, "routes-set", "routed")
    assert code == 0 and json.loads(out)["routes"] == []


def test_admin_sets_and_lists_a_projects_egress_hosts(
    live_server: tuple[str, int],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "http://{}:{}".format(*live_server)
    monkeypatch.setenv("GATE_TOKEN", ADMIN_TOKEN)
    assert run(capsys, "admin", "--url", url, "project-create", "fetching")[0] == 0
    code, out, err = run(
        capsys, "admin", "--url", url, "egress-set", "fetching", "--host", "api.example.com",
        "--host", "*.example.org",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["hosts"] == ["api.example.com", "*.example.org"]
    code, out, _ = run(capsys, "admin", "--url", url, "egress", "fetching")
    assert code == 0 and json.loads(out)["hosts"] == ["api.example.com", "*.example.org"]
    code, _, err = run(capsys, "admin", "--url", url, "egress-set", "fetching", "--host", "a b")
    assert code == 2 and "not a host name" in err


def test_admin_stores_and_lists_a_projects_api_spec(
    live_server: tuple[str, int],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    url = "http://{}:{}".format(*live_server)
    monkeypatch.setenv("GATE_TOKEN", ADMIN_TOKEN)
    assert run(capsys, "admin", "--url", url, "project-create", "calling")[0] == 0
    spec = tmp_path / "orders.yaml"
    spec.write_text(
        "openapi: 3.0.3\n"
        "servers: [{url: 'https://orders.example.com'}]\n"
        "paths:\n  /orders/{id}:\n    get: {operationId: getOrder}\n"
    )
    code, out, err = run(
        capsys, "admin", "--url", url, "api-spec-set", "calling", "orders", str(spec),
        "--header", "Authorization=Bearer ${ORDERS_KEY}",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["tools"] == ["order_get"]
    code, out, _ = run(capsys, "admin", "--url", url, "api-specs", "calling")
    (listed,) = json.loads(out)["specs"]
    assert (listed["prefix"], listed["headers"]) == ("orders", ["Authorization"])
    code, _, err = run(capsys, "admin", "--url", url, "api-spec-set", "calling", "orders",
                       str(spec), "--header", "no-equals-sign")  # fmt: skip
    assert code == 2 and "must be NAME=VALUE" in err


def test_admin_deletes_a_project_and_its_tokens_stop_working(
    live_server: tuple[str, int],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    url = "http://{}:{}".format(*live_server)
    monkeypatch.setenv("GATE_TOKEN", ADMIN_TOKEN)
    assert run(capsys, "admin", "--url", url, "project-create", "doomed")[0] == 0
    code, out, _ = run(
        capsys, "admin", "--url", url, "token-create", "doomed", "--scope", "submit", "--scope",
        "read",
    )  # fmt: skip
    token = json.loads(out)["token"]
    project = calculator_project(tmp_path / "p", failing=False)
    code, out, err = run(
        capsys, "submit", str(project), "--no-wait", "--url", url, "--token", token
    )
    assert code == 0, err

    # Without --yes it asks; no answer (no terminal) deletes nothing.
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, _, err = run(capsys, "admin", "--url", url, "project-delete", "doomed")
    assert code == 1 and "Aborted" in err
    assert run(capsys, "admin", "--url", url, "token-list", "doomed")[0] == 0

    code, out, err = run(capsys, "admin", "--url", url, "project-delete", "doomed", "--yes")
    assert code == 0, err
    deleted = json.loads(out)
    assert deleted["name"] == "doomed"
    assert deleted["counts"]["gates"] == 1 and deleted["counts"]["gates_stopped"] == 1
    assert deleted["counts"]["tokens"] == 1
    code, _, err = run(capsys, "submit", str(project), "--url", url, "--token", token)
    assert code == 2 and f"the token {token[:8]}… is not known" in err
    code, out, _ = run(capsys, "admin", "--url", url, "audit")
    (event,) = [e for e in json.loads(out)["items"] if e["action"] == "project.deleted"]
    assert event["detail"]["project"] == "doomed"

    code, _, err = run(capsys, "admin", "--url", url, "project-delete", "doomed", "--yes")
    assert code == 2 and "404 NotFound" in err
    code, _, err = run(capsys, "admin", "--url", url, "project-delete", "default", "--yes")
    assert code == 2 and "409 Conflict" in err and "cannot be deleted" in err

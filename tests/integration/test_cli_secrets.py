"""`gate admin secret-set`, `secrets` and `secret-delete` against a real server on Postgres.

Each command runs through Typer's CliRunner at 120 and 80 columns (COLUMNS, which the Rich
console Typer draws its own errors with reads): a refusal is one whole line whatever the
width, and a secret's value is never an argument and never printed.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
import uvicorn
from click.testing import Result
from cryptography.fernet import Fernet
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from gate_service.cli import app
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.main import create_app
from gate_service.models import Project
from gate_service.secrets.crypto import SecretBox
from gate_service.secrets.service import project_secrets
from tests.fixtures.auth import ADMIN_TOKEN, bearer, project_token
from tests.fixtures.ports import free_port

VALUE = "sk-cli-secret-7c1e93b0d45a"
OTHER = "sk-other-secret-28f4a6c0e9b1"


@dataclass(frozen=True)
class Gate:
    url: str
    settings: Settings
    api: httpx.Client  # holds the bootstrap admin token


@pytest.fixture
def gate(database_url: str, tmp_path: Path) -> Iterator[Gate]:
    """A real uvicorn server in a thread (as tests/fixtures/live.py), with its own secrets
    key, so that a test can decrypt what a case of the project would get."""
    settings = Settings(
        database_url=database_url,
        bootstrap_token=ADMIN_TOKEN,
        data_dir=tmp_path / "data",
        secrets_key=Fernet.generate_key().decode(),
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, headers=bearer(ADMIN_TOKEN), timeout=30) as api:
            assert api.post("/v1/projects", json={"name": "shop"}).status_code == 201
            yield Gate(url, settings, api)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(params=[120, 80], ids=["120-columns", "80-columns"])
def columns(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def gate_admin(
    gate: Gate, columns: int, *argv: str, stdin: str | None = None, token: str | None = ADMIN_TOKEN
) -> Result:
    """`gate admin ARGV` with ``stdin`` (not a terminal) at ``columns`` columns."""
    env = {
        "COLUMNS": str(columns),
        "GATE_URL": gate.url,
        "GATE_TOKEN": token,  # None: unset
    }
    return CliRunner().invoke(app, ["admin", *argv], input=stdin, env=env)


def one_line(result: Result, text: str) -> str:
    """The stderr line holding ``text`` whole (it must not be wrapped at any width)."""
    lines = [line for line in result.stderr.splitlines() if text in line]
    assert lines, f"{text!r} is not whole on one line of:\n{result.stderr}"
    return lines[0]


def stored(gate: Gate, sessions: sessionmaker[Session]) -> dict[str, str]:
    """What every case of project shop gets (worker/handler.py reads it so)."""
    with session_scope(sessions) as session:
        project = session.scalars(select(Project).where(Project.name == "shop")).one()
        return project_secrets(session, SecretBox.from_settings(gate.settings), project.id)


def events(gate: Gate, action: str) -> list[dict[str, Any]]:
    items = gate.api.get("/v1/audit", params={"limit": 500}).json()["items"]
    return [e for e in items if e["action"] == action]


def never_shown(result: Result, *values: str) -> None:
    for value in values:
        assert value not in result.output
        assert value not in result.stderr


def test_secret_set_reads_stdin_stores_it_for_cases_and_never_prints_it(
    gate: Gate, columns: int, sessions: sessionmaker[Session]
) -> None:
    result = gate_admin(gate, columns, "secret-set", "shop", "OPENAI_API_KEY", stdin=VALUE + "\n")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert (answer["project"], answer["name"], answer["created"]) == (
        "shop",
        "OPENAI_API_KEY",
        True,
    )
    never_shown(result, VALUE)
    # Through the API: the name is there; and a case gets the value, less the line ending.
    listed = gate.api.get("/v1/projects/shop/secrets").json()["items"]
    assert [s["name"] for s in listed] == ["OPENAI_API_KEY"]
    assert stored(gate, sessions) == {"OPENAI_API_KEY": VALUE}

    # Set again, with a CRLF ending: replaced, one event per put, never a value in them.
    result = gate_admin(gate, columns, "secret-set", "shop", "OPENAI_API_KEY", stdin=OTHER + "\r\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["created"] is False
    never_shown(result, OTHER)
    assert stored(gate, sessions) == {"OPENAI_API_KEY": OTHER}
    puts = events(gate, "secret.put")
    assert [(e["detail"]["name"], e["detail"]["created"]) for e in puts] == [
        ("OPENAI_API_KEY", False),
        ("OPENAI_API_KEY", True),
    ]
    assert VALUE not in json.dumps(puts) and OTHER not in json.dumps(puts)


def test_a_value_inside_keeps_its_own_line_breaks(
    gate: Gate, columns: int, sessions: sessionmaker[Session]
) -> None:
    pem = "-----BEGIN KEY-----\nabc\ndef\n-----END KEY-----"
    result = gate_admin(gate, columns, "secret-set", "shop", "SIGNING_KEY", stdin=pem + "\n")
    assert result.exit_code == 0, result.output
    assert stored(gate, sessions) == {"SIGNING_KEY": pem}


def test_secret_set_prompts_without_echo_on_a_terminal(
    gate: Gate, columns: int, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The module (gate_service.cli.admin, as an attribute, is its Typer group).
    commands = importlib.import_module("gate_service.cli.admin")
    monkeypatch.setattr(commands, "_stdin_is_terminal", lambda: True)
    typed = f"{VALUE}\n{VALUE}\n"  # typed twice: the prompt asks for a confirmation
    result = gate_admin(gate, columns, "secret-set", "shop", "ANTHROPIC_API_KEY", stdin=typed)
    assert result.exit_code == 0, result.output
    assert "Value of ANTHROPIC_API_KEY (not shown)" in result.stderr
    never_shown(result, VALUE)
    assert stored(gate, sessions) == {"ANTHROPIC_API_KEY": VALUE}


def test_the_command_has_no_value_argument_and_refuses_one_unprinted(
    gate: Gate, columns: int, sessions: sessionmaker[Session]
) -> None:
    admin = typer.main.get_command(app).commands["admin"]
    command = admin.commands["secret-set"]
    assert [p.name for p in command.params] == ["project", "name"]
    for extra in ([VALUE], ["--value", VALUE], [f"--value={VALUE}"], ["--", VALUE]):
        result = gate_admin(
            gate, columns, "secret-set", "shop", "OPENAI_API_KEY", *extra, stdin=OTHER
        )
        assert result.exit_code == 2, (extra, result.output)
        line = one_line(result, "secret-set takes only PROJECT and NAME")
        assert "not shown" in line and "pipe it on stdin" in line
        never_shown(result, VALUE, OTHER)
    assert stored(gate, sessions) == {}
    assert events(gate, "secret.put") == []


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        (
            "GATE_ADMIN",
            VALUE,
            "400 BadRequest: secret name 'GATE_ADMIN' is refused: names "
            "starting with GATE_ are refused",
        ),
        ("LD_PRELOAD", VALUE, "400 BadRequest: secret name 'LD_PRELOAD' is refused"),
        (
            "TMPDIR",
            VALUE,
            "400 BadRequest: secret name 'TMPDIR' is refused: TMPDIR is refused: glibc acts on it",
        ),
        (
            "openai_key",
            VALUE,
            "400 BadRequest: secret name 'openai_key' is refused: it must be "
            "an environment-variable name",
        ),
        # Quoted whole: not PUT .../secrets/OPENAI (a fragment), nor a shorter path.
        ("OPENAI#X", VALUE, "400 BadRequest: secret name 'OPENAI#X' is refused"),
        ("..", VALUE, "400 BadRequest: secret name '..' is refused"),
        (
            "OPENAI_API_BASE",
            "http://169.254.169.254/latest/meta-data",
            "422 RequestInvalid: the secret OPENAI_API_BASE names a model provider's endpoint, "
            "and its value is not one the gateway calls",
        ),
    ],
)
def test_refusals_exit_2_with_the_apis_reason_and_no_value(
    gate: Gate,
    columns: int,
    sessions: sessionmaker[Session],
    name: str,
    value: str,
    reason: str,
) -> None:
    result = gate_admin(gate, columns, "secret-set", "shop", name, stdin=value + "\n")
    assert result.exit_code == 2, result.output
    assert one_line(result, reason).startswith("gate admin: ")
    assert result.stdout == ""
    never_shown(result, value)
    assert stored(gate, sessions) == {}
    assert events(gate, "secret.put") == []


def test_who_may_not_is_refused_with_exit_2(gate: Gate, columns: int) -> None:
    result = gate_admin(gate, columns, "secret-set", "nowhere", "API_KEY", stdin=VALUE)
    assert result.exit_code == 2
    one_line(result, "404 NotFound")
    never_shown(result, VALUE)
    result = gate_admin(gate, columns, "secret-set", "shop", "API_KEY", stdin=VALUE, token=None)
    assert result.exit_code == 2
    one_line(result, "401 Unauthorized")
    reader = project_token(gate.api, "shop", ["submit", "read"])
    for argv in (("secret-set", "shop", "API_KEY"), ("secrets", "shop"),
                 ("secret-delete", "shop", "API_KEY")):  # fmt: skip
        result = gate_admin(gate, columns, *argv, stdin=VALUE, token=reader)
        assert result.exit_code == 2, argv
        one_line(result, "403 Forbidden")
        never_shown(result, VALUE)
    assert gate.api.get("/v1/projects/shop/secrets").json()["items"] == []


def test_an_empty_value_is_refused_before_anything_is_sent(gate: Gate, columns: int) -> None:
    for empty in ("", "\n"):
        result = gate_admin(gate, columns, "secret-set", "shop", "API_KEY", stdin=empty)
        assert result.exit_code == 2
        one_line(result, "gate admin: the value of API_KEY is empty")
    assert events(gate, "secret.put") == []


def test_secrets_lists_names_and_times_never_values(gate: Gate, columns: int) -> None:
    for name, value in (("OPENAI_API_KEY", VALUE), ("CORP_KEY", OTHER)):
        assert gate_admin(gate, columns, "secret-set", "shop", name, stdin=value).exit_code == 0
    result = gate_admin(gate, columns, "secrets", "shop")
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert listed["project"] == "shop"
    assert [s["name"] for s in listed["items"]] == ["CORP_KEY", "OPENAI_API_KEY"]
    assert all(set(s) == {"name", "updated_at"} for s in listed["items"])
    never_shown(result, VALUE, OTHER)


def test_secret_delete_removes_it_and_is_audited(
    gate: Gate, columns: int, sessions: sessionmaker[Session]
) -> None:
    assert gate_admin(gate, columns, "secret-set", "shop", "API_KEY", stdin=VALUE).exit_code == 0
    result = gate_admin(gate, columns, "secret-delete", "shop", "API_KEY")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"project": "shop", "name": "API_KEY", "deleted": True}
    assert stored(gate, sessions) == {}
    (deleted,) = events(gate, "secret.deleted")
    assert deleted["detail"] == {"project": "shop", "name": "API_KEY"}
    result = gate_admin(gate, columns, "secret-delete", "shop", "API_KEY")
    assert result.exit_code == 2
    one_line(result, "404 NotFound: project shop has no secret named API_KEY")
    # ".." reaches the API as a name, never as DELETE /v1/projects/shop.
    result = gate_admin(gate, columns, "secret-delete", "shop", "..")
    assert result.exit_code == 2
    one_line(result, "400 BadRequest: secret name '..' is refused")
    assert gate.api.get("/v1/projects/shop/secrets").status_code == 200

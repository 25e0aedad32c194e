"""A case's model calls are stored with it, summed into the gate JSON, and exported as a replay
suite (issue 20, items 4 and 5: storage, API and CLI). Real Postgres; the calls are the
gateway's CallRecords, handed to save_model_calls as the worker's store does."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from gate_runner.gateway_wire import CompletionReply, CompletionRequest, GatewayError
from gate_runner.models import ReplayModel, request_key
from gate_service.cli import main
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.gates import lifecycle
from gate_service.gates.model_calls import MAX_STORED_REQUEST_BYTES
from gate_service.gateway import CallRecord
from gate_service.models import Bundle, Case, Gate, GateStatus, ModelCall, Project
from gate_service.secrets.redact import Redactor
from gate_service.stored_runs import MIN_STORED_RUN_BYTES, RunCap
from gate_service.worker.retention import run_retention
from tests.fixtures.auth import ADMIN_TOKEN, as_token, project_token
from tests.fixtures.live import live_server  # noqa: F401 (fixture)

SECRET = "sk-live-0123456789abcdef0123456789abcdef"
NO_SECRETS = Redactor({})


def call(
    agent: str,
    text_in: str,
    answer: str | None = "ok",
    *,
    tokens: tuple[int, int] = (10, 5),
    cost: float = 0.001,
    error: GatewayError | None = None,
) -> CallRecord:
    """A call as a channel records it: an answer, or (answer None) the error."""
    request = CompletionRequest(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": text_in}], agent=agent
    ).replay_request()
    key = request_key(request)
    reply = None
    if answer is not None:
        reply = CompletionReply(
            content=answer,
            tool_calls=[],
            usage={"prompt_tokens": tokens[0], "completion_tokens": tokens[1]},
            cost_usd=cost,
            latency_ms=12,
            request_hash=key,
            attempts=1,
        )
    return CallRecord(
        request_hash=key,
        request=request,
        agent=agent,
        status="ok" if reply else (error.kind if error else "provider"),
        reply=reply,
        error=error,
        tokens_in=tokens[0] if reply else 0,
        tokens_out=tokens[1] if reply else 0,
        cost_usd=cost if reply else 0.0,
        latency_ms=12,
        attempts=1,
    )


def make_gate(sessions: sessionmaker[Session], project: str, cases: list[str]) -> str:
    """A finished gate of ``project`` with cases of agent ``calc`` named ``cases``."""
    with session_scope(sessions) as s:
        project_id = s.scalars(select(Project.id).where(Project.name == project)).one()
        sha = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
        s.add(
            Bundle(
                sha256=sha,
                archive_format="tar.gz",
                size_bytes=0,
                code_bytes=0,
                fixture_bytes=0,
            )
        )
        gate = Gate(project_id=project_id, bundle_sha256=sha, status=GateStatus.passed)
        s.add(gate)
        s.flush()
        for position, name in enumerate(cases):
            s.add(
                Case(
                    gate_id=gate.id,
                    position=position,
                    suite="tests/calc.yaml",
                    agent_name="calc",
                    test_name=name,
                    status="passed",
                    passed=True,
                    runs=1,
                    success_threshold=100,
                    timeout_s=30,
                    successes=1,
                )
            )
        return str(gate.id)


def save(
    sessions: sessionmaker[Session],
    gate_id: str,
    case_name: str,
    records: list[CallRecord],
    redact: Redactor = NO_SECRETS,
    cap: RunCap | None = None,
) -> None:
    """As the worker's store does: in one transaction, the gate locked."""
    with session_scope(sessions) as s:
        gate = uuid.UUID(gate_id)
        lifecycle.lock_gate_for_case_write(s, gate)
        case = s.scalars(
            select(Case.id).where(Case.gate_id == gate).where(Case.test_name == case_name)
        ).one()
        stored_bytes = lifecycle.save_model_calls(s, gate, case, records, redact, cap=cap)
        lifecycle.count_case_write(s, gate, stored_bytes)


def stored(sessions: sessionmaker[Session], gate_id: str) -> tuple[list[dict[str, Any]], int]:
    """The gate's model_calls rows as Postgres holds them (as text), and its result_bytes."""
    with session_scope(sessions) as s:
        rows = s.execute(
            text(
                "SELECT row_to_json(m)::text AS row, m.stored_bytes, m.request IS NULL AS "
                "no_request, m.request_hash FROM model_calls m WHERE m.gate_id = :g "
                "ORDER BY m.position"
            ),
            {"g": uuid.UUID(gate_id)},
        ).all()
        result_bytes = s.scalars(
            select(Gate.result_bytes).where(Gate.id == uuid.UUID(gate_id))
        ).one()
    return [dict(r._mapping) for r in rows], int(result_bytes)


@pytest.fixture
def gate_id(client: TestClient, sessions: sessionmaker[Session]) -> str:
    return make_gate(sessions, "default", ["first", "second", "third"])


def test_calls_are_stored_redacted_and_count_into_result_bytes(
    client: TestClient, sessions: sessionmaker[Session], gate_id: str
) -> None:
    records = [
        call("calc", f"my key is {SECRET}, add 1 and 2"),
        call("calc", "and again", None, error=GatewayError(kind="provider", message=SECRET)),
    ]
    save(sessions, gate_id, "first", records, Redactor({"OPENAI_API_KEY": SECRET}))
    rows, result_bytes = stored(sessions, gate_id)
    assert len(rows) == 2
    for row in rows:
        assert SECRET not in row["row"]
        assert "[REDACTED:OPENAI_API_KEY]" in row["row"]
    first = json.loads(rows[0]["row"])
    assert first["request_hash"] == records[0].request_hash  # the key of the request as sent
    assert first["response"] == {
        "content": "ok",
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
    }
    assert (first["status"], first["tokens_in"], first["tokens_out"]) == ("ok", 10, 5)
    second = json.loads(rows[1]["row"])
    assert second["response"] is None
    assert second["error"]["kind"] == "provider"
    assert second["status"] == "provider"
    assert result_bytes == sum(r["stored_bytes"] for r in rows) > 0

    # A retried case replaces its calls; the gate's bytes follow.
    save(sessions, gate_id, "first", records[:1])
    rows, result_bytes = stored(sessions, gate_id)
    assert len(rows) == 1
    assert result_bytes == rows[0]["stored_bytes"]


def test_an_oversized_request_is_stored_as_null_with_its_key_and_still_replays(
    client: TestClient, sessions: sessionmaker[Session], gate_id: str, tmp_path: Path
) -> None:
    big = call("calc", "x" * (MAX_STORED_REQUEST_BYTES + 1), "a big answer")
    save(sessions, gate_id, "first", [big])
    (row,), result_bytes = stored(sessions, gate_id)
    assert row["no_request"] is True
    assert row["request_hash"] == big.request_hash
    assert result_bytes == row["stored_bytes"] < MAX_STORED_REQUEST_BYTES

    answer = client.get(f"/v1/gates/{gate_id}/recordings").json()
    (item,) = answer["recordings"]
    assert item["content"] == {
        "key": big.request_hash,
        "request": None,
        "response": {
            "content": "a big answer",
            "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        },
    }
    folder = tmp_path / "calc"
    folder.mkdir()
    (folder / "r.json").write_text(json.dumps(item["content"]))
    reply = ReplayModel(folder).complete(
        model=big.request["model"],
        messages=big.request["messages"],
        tools=[],
        temperature=0.0,
        context={},
    )
    assert reply.content == "a big answer"


def test_over_the_project_quota_bodies_are_kept_only_to_the_floor(
    client: TestClient, sessions: sessionmaker[Session], gate_id: str
) -> None:
    floor = RunCap(MIN_STORED_RUN_BYTES, "the project's quota is reached")
    small, large = call("calc", "small"), call("calc", "y" * MIN_STORED_RUN_BYTES, "z" * 5000)
    save(sessions, gate_id, "first", [small, large], cap=floor)
    with session_scope(sessions) as s:
        calls = s.scalars(select(ModelCall).order_by(ModelCall.position)).all()
        assert calls[0].request is not None and calls[0].response is not None
        assert calls[1].request is None and calls[1].response is None
        assert calls[1].request_hash == large.request_hash
        assert calls[1].tokens_in == 10  # the totals still count it


def test_the_gate_json_carries_totals_per_gate_and_per_case(
    client: TestClient, sessions: sessionmaker[Session], gate_id: str
) -> None:
    before = client.get(f"/v1/gates/{gate_id}")
    assert before.json()["model_calls"] == {
        "calls": 0,
        "answered": 0,
        "failed": 0,
        "tokens_in": 0,
        "tokens_out": 0,
        "cost_usd": 0.0,
    }
    save(
        sessions,
        gate_id,
        "first",
        [call("calc", "a", tokens=(100, 20), cost=0.01), call("calc", "b", tokens=(50, 10))],
    )
    failed = call("calc", "c", None, error=GatewayError(kind="budget", message="over"))
    save(sessions, gate_id, "second", [failed])
    after = client.get(f"/v1/gates/{gate_id}", headers={"If-None-Match": before.headers["ETag"]})
    assert after.status_code == 200  # storing calls is a change of the gate
    gate = after.json()
    assert gate["model_calls"] == {
        "calls": 3,
        "answered": 2,
        "failed": 1,
        "tokens_in": 150,
        "tokens_out": 30,
        "cost_usd": pytest.approx(0.011),
    }
    by_case = {c["test_name"]: c["model_calls"] for c in gate["cases"]}
    assert by_case["first"] == {
        "calls": 2,
        "answered": 2,
        "failed": 0,
        "tokens_in": 150,
        "tokens_out": 30,
        "cost_usd": pytest.approx(0.011),
    }
    # The budget's refusal never reached a provider: a failed call, no answered one.
    assert by_case["second"] == {
        "calls": 1,
        "answered": 0,
        "failed": 1,
        "tokens_in": 0,
        "tokens_out": 0,
        "cost_usd": 0.0,
    }
    assert by_case["third"]["calls"] == 0


def test_tokens_and_cost_are_counted_only_for_answered_calls(
    client: TestClient, sessions: sessionmaker[Session], gate_id: str
) -> None:
    # A failed call that carried counts (as a provider's error might) is still no answer.
    failed = replace(
        call("calc", "d", None, error=GatewayError(kind="provider", message="HTTP 500")),
        tokens_in=7,
        tokens_out=3,
        cost_usd=0.5,
    )
    save(sessions, gate_id, "first", [call("calc", "a", tokens=(100, 20), cost=0.01), failed])
    assert client.get(f"/v1/gates/{gate_id}").json()["model_calls"] == {
        "calls": 2,
        "answered": 1,
        "failed": 1,
        "tokens_in": 100,
        "tokens_out": 20,
        "cost_usd": pytest.approx(0.01),
    }


def test_recordings_are_the_answered_calls_deduplicated_and_only_for_their_project(
    client: TestClient, sessions: sessionmaker[Session], gate_id: str
) -> None:
    first, again = call("calc", "add 1 and 2", "3"), call("calc", "add 1 and 2", "three")
    other_agent = call("doubler", "double 4", "8")
    failed = call("calc", "x", None, error=GatewayError(kind="deadline", message="late"))
    unsafe = call("../escape", "y", "z")
    save(sessions, gate_id, "first", [first, failed, again])
    save(sessions, gate_id, "second", [other_agent, unsafe])

    answer = client.get(f"/v1/gates/{gate_id}/recordings")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["left_out"] == 1  # the unsafe agent name
    paths = [r["path"] for r in body["recordings"]]
    assert paths == [
        f"tests/recordings/calc/{first.request_hash[:24]}.json",
        f"tests/recordings/doubler/{other_agent.request_hash[:24]}.json",
    ]
    # The same request twice: one file, the last answer.
    assert body["recordings"][0]["content"]["response"]["content"] == "three"
    assert body["recordings"][0]["content"]["request"] == first.request

    # Another project's token, read scope and all, sees no such gate; neither that project's
    # gate nor a gate that does not exist tells it anything.
    other = as_token(client, project_token(client, "other", ["read"]))
    refused = other.get(f"/v1/gates/{gate_id}/recordings")
    assert refused.status_code == 404
    assert refused.json()["error"] == other.get(f"/v1/gates/{gate_id}").json()["error"]
    assert other.get(f"/v1/gates/{uuid.uuid4()}/recordings").status_code == 404
    # A token without the read scope is refused as for the gate itself.
    submit_only = as_token(client, project_token(client, "default", ["submit"]))
    assert submit_only.get(f"/v1/gates/{gate_id}/recordings").status_code == 403


def test_retention_deletes_a_gates_calls_with_it(
    client: TestClient, sessions: sessionmaker[Session], gate_id: str, settings: Settings
) -> None:
    save(sessions, gate_id, "first", [call("calc", "a")])
    with session_scope(sessions) as s:
        s.execute(
            text("UPDATE gates SET finished_at = now() - interval '400 days' WHERE id = :g"),
            {"g": uuid.UUID(gate_id)},
        )
    report = run_retention(sessions, settings)
    assert report.total.gates == 1
    with session_scope(sessions) as s:
        assert s.scalar(text("SELECT count(*) FROM model_calls")) == 0


@pytest.fixture
def server_url(live_server: tuple[str, int]) -> str:  # noqa: F811
    return "http://{}:{}".format(*live_server)


def test_the_cli_writes_the_recordings_and_replay_finds_each_key(
    server_url: str,
    sessions: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    gate = make_gate(sessions, "default", ["first", "second"])
    calls = [call("calc", "add 1 and 2", "3"), call("calc", "add 2 and 2", "4")]
    doubled = [call("doubler", "double 4", "8")]
    save(sessions, gate, "first", calls)
    save(sessions, gate, "second", doubled)

    project = tmp_path / "project"
    code = main(
        ["recordings", gate, "--out", str(project), "--url", server_url, "--token", ADMIN_TOKEN]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "calc: 2 file(s)" in out
    assert "doubler: 1 file(s)" in out
    for agent, made in (("calc", calls), ("doubler", doubled)):
        folder = project / "tests" / "recordings" / agent
        assert len(list(folder.glob("*.json"))) == len(made)
        replay = ReplayModel(folder)
        for record in made:
            assert record.request_hash in replay.recordings
            reply = replay.complete(
                model=record.request["model"],
                messages=record.request["messages"],
                tools=[],
                temperature=0.0,
                context={},
            )
            assert record.reply is not None
            assert reply.content == record.reply.content

    # Another project's token: exit 2, nothing written.
    elsewhere = tmp_path / "elsewhere"
    code = main(
        ["recordings", gate, "--out", str(elsewhere), "--url", server_url, "--token", "nope"]
    )
    assert code == 2
    assert not elsewhere.exists()

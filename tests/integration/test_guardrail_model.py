"""A project's guardrail (judge) model, issue 38 item 6: set, read and removed through the
admin API and `gate admin`, refused with a clear 422 when it is no model name, checked with
the agents' models before any case runs (item 4), handed to every case's runner, and, when
the project names none, a gate warning naming the judged guardrails, their cases and the fix.

Real Postgres, app, queue, worker and gateway (its LiteLLM provider lookup); the fake sandbox
runs the real runner in this process, against the OpenAI-compatible fake provider.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.cli import main
from gate_service.config import Settings
from gate_service.gateway import ModelGateway
from tests.fixtures.auth import ADMIN_TOKEN, as_token, project_token
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.live import live_server  # noqa: F401 (fixture)
from tests.fixtures.projects import bundle_of, write
from tests.fixtures.worked import submit_and_work as judge

JUDGE = "openai/gpt-4o-mini"


def refused(response: Any, *says: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"error", "detail", "problems"}, body
    assert body["error"] == "RequestInvalid"
    assert [p["location"] for p in body["problems"]] == ["body.model"], body
    for said in says:
        assert said in body["detail"], body["detail"]
    return body


# -- the setting ---------------------------------------------------------------------------


def test_an_admin_sets_reads_and_removes_the_judge_model_each_change_audited(
    client: TestClient,
) -> None:
    assert client.post("/v1/projects", json={"name": "shop"}).status_code == 201
    r = client.get("/v1/projects/shop/guardrail-model")
    assert (r.status_code, r.json()) == (200, {"project": "shop", "model": None})

    r = client.put("/v1/projects/shop/guardrail-model", json={"model": JUDGE})
    assert (r.status_code, r.json()) == (200, {"project": "shop", "model": JUDGE})
    assert client.get("/v1/projects/shop/guardrail-model").json()["model"] == JUDGE
    # Shown with the project's other settings.
    r = client.patch("/v1/projects/shop", json={"retention_days": 9})
    assert r.json()["guardrail_model"] == JUDGE

    other = "ollama/llama3:8b"
    assert client.put("/v1/projects/shop/guardrail-model", json={"model": other}).status_code == 200
    r = client.delete("/v1/projects/shop/guardrail-model")
    assert (r.status_code, r.json()) == (200, {"project": "shop", "model": None})
    assert client.get("/v1/projects/shop/guardrail-model").json()["model"] is None
    # Removing what is not there changes nothing and records nothing.
    assert client.delete("/v1/projects/shop/guardrail-model").status_code == 200

    actions = ["project.guardrail_model_set", "project.guardrail_model_deleted"]
    events = client.get("/v1/audit", params={"action": actions}).json()["items"]
    assert [(e["action"], e["detail"]) for e in reversed(events)] == [
        ("project.guardrail_model_set", {"project": "shop", "guardrail_model": [None, JUDGE]}),
        ("project.guardrail_model_set", {"project": "shop", "guardrail_model": [JUDGE, other]}),
        ("project.guardrail_model_deleted", {"project": "shop", "guardrail_model": [other, None]}),
    ]


def test_only_the_projects_admins_see_or_change_it(client: TestClient) -> None:
    reader = as_token(client, project_token(client, "shop", ["submit", "read"]))
    assert reader.get("/v1/projects/shop/guardrail-model").status_code == 403
    assert reader.put("/v1/projects/shop/guardrail-model", json={"model": JUDGE}).status_code == 403
    assert reader.delete("/v1/projects/shop/guardrail-model").status_code == 403
    stranger = as_token(client, project_token(client, "other", ["admin"]))
    for r in (
        stranger.get("/v1/projects/shop/guardrail-model"),
        stranger.put("/v1/projects/shop/guardrail-model", json={"model": JUDGE}),
        stranger.delete("/v1/projects/shop/guardrail-model"),
    ):
        assert r.status_code == 404, r.text
    assert client.get("/v1/projects/shop/guardrail-model").json()["model"] is None
    assert (
        stranger.put("/v1/projects/other/guardrail-model", json={"model": JUDGE}).status_code == 200
    )


def test_a_hostile_model_name_is_a_422_saying_what_where_and_the_limit(
    client: TestClient,
) -> None:
    url = "/v1/projects/default/guardrail-model"
    started = time.perf_counter()
    body = refused(client.put(url, json={"model": "a" * 10_000}), "at most 200 characters")
    assert time.perf_counter() - started < 5
    assert "a" * 201 not in json.dumps(body)  # the input is not echoed back
    for name, says in (
        ("openai/gpt\x00-4o", "the unprintable character U+0000 at position 11"),
        ("openai/gpt-4o\x1b[31m", "the unprintable character U+001B at position 14"),
        ("openai/gpt-4o\n--model-mode=live", "U+000A at position 14"),
        ("openai/gpt 4o", "a space (U+0020) at position 11"),
        ("openai/gpt-4o'; rm -rf /", '"\'" (U+0027) at position 14'),
        ("openai/gpt-\u202e4o", "U+202E at position 12"),
        ("--model-mode=live", "starts with '-'"),
        ("", "at least 1 character"),
    ):
        detail = refused(client.put(url, json={"model": name}), says)["detail"]
        if name:
            assert "ASCII letters, digits and . _ - / : @ +" in detail, detail
    # A lone surrogate, escaped in the JSON: no character, and no 500.
    lone = client.put(
        url, content=b'{"model": "a\\ud800b"}', headers={"Content-Type": "application/json"}
    )
    refused(lone, "body.model: Input should be a valid string")
    # Not a string, an extra field, no body: the same shape.
    assert client.put(url, json={"model": 5}).status_code == 422
    r = client.put(url, json={"model": JUDGE, "extra": 1})
    assert r.status_code == 422 and r.json()["problems"][0]["location"] == "body.extra"
    assert client.put(url).status_code == 422
    assert client.get(url).json()["model"] is None  # nothing was stored


# -- gate admin ----------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_gate_admin_sets_shows_and_clears_the_judge_model(
    live_server: tuple[str, int],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "http://{}:{}".format(*live_server)
    monkeypatch.setenv("GATE_TOKEN", ADMIN_TOKEN)
    code, out, _ = run(capsys, "admin", "--url", url, "project-create", "judged")
    assert code == 0 and json.loads(out)["guardrail_model"] is None
    code, out, err = run(capsys, "admin", "--url", url, "guardrail-model-set", "judged", JUDGE)
    assert code == 0, err
    assert json.loads(out) == {"project": "judged", "model": JUDGE}
    code, out, _ = run(capsys, "admin", "--url", url, "guardrail-model", "judged")
    assert code == 0 and json.loads(out)["model"] == JUDGE
    # What the API refuses comes back as exit 2 with its reason.
    code, _, err = run(capsys, "admin", "--url", url, "guardrail-model-set", "judged", "a" * 10_000)
    assert code == 2 and "422 RequestInvalid" in err and "at most 200 characters" in err
    code, _, err = run(capsys, "admin", "--url", url, "guardrail-model-set", "judged", "x\ty")
    assert code == 2 and "U+0009 at position 2" in err
    code, _, err = run(capsys, "admin", "--url", url, "guardrail-model-set", "nobody", JUDGE)
    assert code == 2 and "404" in err
    code, out, _ = run(capsys, "admin", "--url", url, "guardrail-model-clear", "judged")
    assert code == 0 and json.loads(out) == {"project": "judged", "model": None}
    code, out, _ = run(capsys, "admin", "--url", url, "guardrail-model", "judged")
    assert code == 0 and json.loads(out)["model"] is None


# -- gates ---------------------------------------------------------------------------------

SCRIPTED = """
    def respond(messages, tools, context):
        return {"content": "hello from the fake provider"}
"""


def guarded(root: Path, *, scripted: bool = False, cases: int = 2) -> bytes:
    """An LLM agent ``bot`` on openai/gpt-4o with a prompt_injection input guardrail and a
    relevance output guardrail, and ``cases`` cases expecting the fake's answer."""
    tests = "".join(
        f"""
              - name: case_{i}
                payload: hi
                expected_result: output == "hello from the fake provider"
        """
        for i in range(cases)
    )
    files = {
        "agents/bot.yaml": """
            version: "1.0"
            name: bot
            description: Talks to a model, guarded.
            model: openai/gpt-4o
            system_prompt: Be brief.
            retry_options: {attempts: 1, initial_delay: 0, max_delay: 1}
            guardrails:
              input: [{type: prompt_injection}]
              output: [{type: relevance}]
        """,
        "tests/bot.yaml": "tests:" + tests,
    }
    if scripted:
        files["tests/models/bot.py"] = SCRIPTED
    return bundle_of(write(root, files))


@pytest.fixture
def shop(client: TestClient, provider: FakeProvider) -> TestClient:
    """Project ``shop`` whose openai/ models go to the fake provider."""
    token = project_token(client, "shop", ["submit", "read"])
    for name, value in (("OPENAI_API_KEY", "sk-shop"), ("OPENAI_API_BASE", provider.url)):
        r = client.put(f"/v1/projects/shop/secrets/{name}", json={"value": value})
        assert r.status_code == 201, r.text
    return as_token(client, token)


def test_a_judge_model_no_key_or_route_answers_ends_the_gate_in_validating(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    judge_model = "anthropic/claude-3-5-haiku-latest"
    r = client.put("/v1/projects/shop/guardrail-model", json={"model": judge_model})
    assert r.status_code == 200, r.text
    gate, sandbox = judge(shop, settings, sessions, gateway, guarded(tmp_path / "p"))

    assert (gate["status"], gate["phase"]) == ("error", "validating"), gate
    reason = gate["failure_reason"]
    for said in (
        "agent 'bot' (guardrail_model anthropic/claude-3-5-haiku-latest, judging its input "
        "prompt_injection, output relevance guardrails)",
        "ANTHROPIC_API_KEY",
        "PUT /v1/projects/shop/secrets/ANTHROPIC_API_KEY",
        "gate admin routes-set shop --route 'anthropic/claude-3-5-haiku-latest=URL#KEY_SECRET'",
        "gate admin guardrail-model-set shop MODEL",
    ):
        assert said in reason, (said, reason)
    assert "openai/gpt-4o" not in reason  # the agent's own model has its key
    (problem,) = gate["problems"]
    assert {k: problem[k] for k in ("agent", "field", "model", "secret", "file")} == {
        "agent": "bot",
        "field": "guardrail_model",
        "model": judge_model,
        "secret": "ANTHROPIC_API_KEY",
        "file": "agents/bot.yaml",
    }
    # Nothing was built, run or called.
    assert gate["cases"] == [] and sandbox.images == {} and sandbox.runs == []
    assert provider.calls == []

    # A scripted agent's guardrails call no judge: no key is asked for, and it runs.
    gate, _ = judge(shop, settings, sessions, gateway, guarded(tmp_path / "s", scripted=True))
    assert gate["status"] == "passed", gate


def test_a_judge_model_that_resolves_reaches_every_cases_runner(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    tmp_path: Path,
) -> None:
    assert client.put("/v1/projects/shop/guardrail-model", json={"model": JUDGE}).status_code == 200
    gate, sandbox = judge(shop, settings, sessions, gateway, guarded(tmp_path / "p"))
    # Past validating: every case ran (its verdict is the runner's judging, not this test's).
    assert gate["phase"] == "done" and gate["judged_cases"] == 2, gate
    assert len(sandbox.runs) == 2
    assert all(f"--guardrail-model={JUDGE}" in argv for argv in sandbox.runs), sandbox.runs
    # Judged: nothing of them to warn of but what may differ from the platform's own check.
    keys = [w["key"] for w in gate["warnings"]]
    assert "guardrails.judged" not in keys
    assert {"guardrails.input.prompt_injection", "guardrails.output.relevance"} <= set(keys)


def test_without_a_judge_model_the_gate_warns_naming_guardrails_cases_and_fix(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    tmp_path: Path,
) -> None:
    gate, sandbox = judge(shop, settings, sessions, gateway, guarded(tmp_path / "p", cases=12))
    assert gate["status"] == "passed", gate  # they are skipped, so they never block
    assert not any(arg.startswith("--guardrail-model") for argv in sandbox.runs for arg in argv)
    first = gate["warnings"][0]  # first among the gate's warnings
    assert {k: first[k] for k in ("file", "agent", "key", "support", "more_cases")} == {
        "file": "agents/bot.yaml",
        "agent": "bot",
        "key": "guardrails.judged",
        "support": "not_in_gate",
        "more_cases": 2,
    }
    assert first["cases"] == [f"tests/bot.yaml::case_{i}" for i in range(10)]
    message = first["message"]
    for said in (
        "the judged guardrails prompt_injection (input), relevance (output) are skipped in "
        "this gate and never block: the project names no guardrail model",
        "tests/bot.yaml::case_0, tests/bot.yaml::case_1",
        "tests/bot.yaml::case_9 and 2 more",
        'PUT /v1/projects/shop/guardrail-model with {"model": MODEL}',
        "gate admin guardrail-model-set shop MODEL",
    ):
        assert said in message, (said, message)

    # Scripted, the warning says so: a judge model alone would not run them.
    gate, _ = judge(shop, settings, sessions, gateway, guarded(tmp_path / "s", scripted=True))
    message = gate["warnings"][0]["message"]
    assert "runs its scripted model tests/models/bot.py" in message
    assert "a scripted model calls no judge" in message
    assert "names no guardrail model" in message


def test_a_rules_own_judge_model_is_checked_too_and_its_fix_is_the_rule(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    tmp_path: Path,
) -> None:
    # The project's judge model resolves (openai/), the rule's own (gemini/) does not.
    assert client.put("/v1/projects/shop/guardrail-model", json={"model": JUDGE}).status_code == 200
    root = tmp_path / "p"
    guarded(root)
    rule = "output: [{type: relevance, config: {model: gemini/gemini-2.0-flash}}]"
    agent = root / "agents" / "bot.yaml"
    agent.write_text(agent.read_text().replace("output: [{type: relevance}]", rule))
    gate, _ = judge(shop, settings, sessions, gateway, bundle_of(root))

    assert (gate["status"], gate["phase"]) == ("error", "validating"), gate
    (problem,) = gate["problems"]  # the project's judge model has its key
    assert (problem["field"], problem["model"], problem["secret"]) == (
        "guardrails.output.relevance.config.model",
        "gemini/gemini-2.0-flash",
        "GEMINI_API_KEY",
    )
    assert "judging its output relevance guardrail" in problem["message"]
    assert "name another model in the rule's config.model (agents/bot.yaml)" in problem["message"]
    assert "guardrail-model-set" not in problem["message"]

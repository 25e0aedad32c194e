"""The model mode is always visible (issue 38, item 7): the worker works each LLM agent's mode
out in validating and stores it as the gate enters building; REST answers the gate's mode
(never null), each agent's and why, the results page shows them, and the totals count only
the calls a provider answered.

Real Postgres, queue and worker; the fake sandbox runs the real runner in this process, and
the live agents call the OpenAI-compatible fake provider through a real gateway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.gateway import ModelGateway
from gate_service.worker.loop import Worker
from tests.fixtures.auth import as_token, project_token
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.projects import bundle_of, results_page_project, write
from tests.fixtures.worked import work_once


def llm(name: str, model: str) -> str:
    return f"""
        version: "1.0"
        name: {name}
        description: An LLM agent.
        model: {model}
        system_prompt: Be brief.
        retry_options: {{attempts: 1, initial_delay: 0, max_delay: 1}}
    """


def answers(agent: str) -> str:
    return f"""
        agent: {agent}
        tests:
          - name: {agent}_answers
            payload: hi
            expected_result: output == "hello from the fake provider"
    """


# Four LLM agents, one per way of choosing: a scripted model, recordings, and two live (the
# provider answers one and fails the other); and a tool agent, which has no model mode.
MIXED = {
    "agents/planner.yaml": llm("planner", "openai/gpt-4o"),
    "agents/writer.yaml": llm("writer", "openai/gpt-4o"),
    "agents/bot.yaml": llm("bot", "openai/gpt-4o"),
    "agents/flaky.yaml": llm("flaky", "openai/flaky-model"),
    "agents/calc.yaml": """
        version: "1.0"
        name: calc
        description: A tool agent.
        type: tool
        tool_name: calc.echo
    """,
    "tools/calc.py": "def echo(payload: dict) -> dict:\n    return payload\n",
    "tests/models/planner.py": """
        def respond(messages, tools, context):
            return {"content": "hello from the fake provider"}
    """,
    "tests/recordings/writer/none.json": "{}",
    "tests/planner.yaml": answers("planner"),
    "tests/writer.yaml": answers("writer"),
    "tests/bot.yaml": answers("bot"),
    "tests/flaky.yaml": answers("flaky"),
    "tests/calc.yaml": """
        agent: calc
        tests:
          - name: echoes
            payload: '{"a": 1}'
            expected_result: output.a == 1
    """,
}


def test_a_validated_gate_answers_each_agent_s_mode_the_gate_s_and_why(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    shop = as_token(client, project_token(client, "shop", ["submit", "read"]))
    for key, value in {"OPENAI_API_KEY": "sk-shop", "OPENAI_API_BASE": provider.url}.items():
        r = client.put(f"/v1/projects/shop/secrets/{key}", json={"value": value})
        assert r.status_code == 201, r.text
    provider.decide = lambda body: "500" if body.get("model") == "flaky-model" else "ok"
    created = shop.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(write(tmp_path, MIXED)))})
    assert created.status_code == 202, created.text
    queued = created.json()
    # Before validating: no mode forced, none worked out yet, and still not null.
    assert (queued["model_mode"], queued["model_modes"], queued["requested_model_mode"]) == (
        "pending",
        {},
        None,
    )
    work_once(settings, sessions, gateway)
    gate: dict[str, Any] = shop.get(f"/v1/gates/{queued['id']}").json()

    assert gate["phase"] == "done", (gate["status"], gate["failure_reason"])
    assert gate["model_mode"] == "mixed"
    assert gate["requested_model_mode"] is None
    assert gate["model_modes"] == {
        "bot": "live",
        "flaky": "live",
        "planner": "scripted",
        "writer": "replay",
    }
    reason = gate["model_mode_reason"]
    assert reason.startswith("chosen by default (no model_mode was submitted)"), reason
    assert reason.endswith("(scripted: planner; replay: writer; live: bot, flaky)"), reason
    # The provider answered bot's call and failed flaky's: one answered, one failed, and
    # only the answered one's tokens.
    totals = gate["model_calls"]
    assert (totals["calls"], totals["answered"], totals["failed"]) == (2, 1, 1), totals
    assert (totals["tokens_in"], totals["tokens_out"]) == (3, 4)
    by_case = {c["test_name"]: c["model_calls"] for c in gate["cases"]}
    assert (by_case["flaky_answers"]["answered"], by_case["flaky_answers"]["failed"]) == (0, 1)

    page = TestClient(client.app, follow_redirects=False, headers={"Origin": "http://testserver"})
    token = project_token(client, "shop", ["read"])
    assert page.post("/ui/sign-in", data={"token": token, "next": "/ui"}).status_code == 303
    html = page.get(f"/ui/gates/{gate['id']}").text
    assert "<dt>Model mode</dt><dd>mixed: <code>bot</code> live, <code>flaky</code> live" in html
    assert "chosen by default (no model_mode was submitted)" in html
    assert "1 model call answered (1 failed), tokens 3 in / 4 out" in html


def test_a_forced_mode_is_the_gate_s_from_the_start_and_needs_no_reason(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    bundle = bundle_of(results_page_project(tmp_path / "p"))
    created = client.post(
        "/v1/gates", files={"bundle": ("b.tgz", bundle)}, data={"model_mode": "scripted"}
    )
    assert created.status_code == 202, created.text
    assert (created.json()["model_mode"], created.json()["requested_model_mode"]) == (
        "scripted",
        "scripted",
    )
    assert worker.run_once()
    gate = client.get(f"/v1/gates/{created.json()['id']}").json()
    assert gate["status"] == "failed", gate["failure_reason"]  # the project's wrong case
    assert (gate["model_mode"], gate["requested_model_mode"]) == ("scripted", "scripted")
    # The tool agent `slow` has no model mode; the LLM agent `support` runs the forced one.
    assert gate["model_modes"] == {"support": "scripted"}
    assert gate["model_mode_reason"] is None


def test_a_gate_whose_cases_reach_no_llm_agent_says_none_and_why(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    files = {k: v for k, v in MIXED.items() if "calc" in k}
    created = client.post(
        "/v1/gates", files={"bundle": ("b.tgz", bundle_of(write(tmp_path, files)))}
    )
    assert created.status_code == 202, created.text
    assert worker.run_once()
    gate = client.get(f"/v1/gates/{created.json()['id']}").json()
    assert gate["status"] == "passed", gate["failure_reason"]
    assert (gate["model_mode"], gate["model_modes"]) == ("none", {})
    assert "no selected case reaches an LLM agent" in gate["model_mode_reason"]
    assert gate["model_calls"]["calls"] == 0


def test_a_gate_that_ends_in_validating_answers_none(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    files = {"agents/calc.yaml": MIXED["agents/calc.yaml"], "tests/calc.yaml": answers("nobody")}
    created = client.post(
        "/v1/gates", files={"bundle": ("b.tgz", bundle_of(write(tmp_path, files)))}
    )
    assert created.status_code == 202, created.text
    assert worker.run_once()
    gate = client.get(f"/v1/gates/{created.json()['id']}").json()
    assert (gate["status"], gate["phase"]) == ("error", "validating"), gate
    assert (gate["model_mode"], gate["model_modes"], gate["model_mode_reason"]) == (
        "none",
        {},
        None,
    )

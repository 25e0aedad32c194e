"""A gate's live models are checked before anything is built: every model a selected case
would call live (an LLM agent's ``model`` and ``fallback_model``, with no scripted model or
recordings, or a gate forced to ``model_mode=live``) resolves to a provider key among the
project's secrets or to a project route, else the gate ends ``error`` in validating naming
each agent, model and fix.

Real Postgres, queue, worker and gateway (its LiteLLM provider lookup); the fake sandbox runs
the real runner in this process, against the OpenAI-compatible fake provider on loopback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.gateway import ModelGateway
from tests.fixtures.auth import as_token, project_token
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.projects import bundle_of, write
from tests.fixtures.worked import submit_and_work as judge

SCRIPTED = """
    def respond(messages, tools, context):
        return {"content": "hello from the fake provider"}
"""


def bot(root: Path, model: str, *, fallback: str | None = None, scripted: bool = False) -> bytes:
    """An LLM agent ``bot`` on ``model`` with one case that expects the fake's answer."""
    fallback_line = f"fallback_model: {fallback}" if fallback else ""
    files = {
        "agents/bot.yaml": f"""
            version: "1.0"
            name: bot
            description: Talks to a model.
            model: {model}
            {fallback_line}
            system_prompt: Be brief.
            retry_options: {{attempts: 1, initial_delay: 0, max_delay: 1}}
        """,
        "tests/bot.yaml": """
            tests:
              - name: answers
                payload: hi
                expected_result: output == "hello from the fake provider"
        """,
    }
    if scripted:
        files["tests/models/bot.py"] = SCRIPTED
    return bundle_of(write(root, files))


@pytest.fixture
def shop(client: TestClient) -> TestClient:
    """Project ``shop`` with no secrets and no routes."""
    return as_token(client, project_token(client, "shop", ["submit", "read"]))


def put_secret(client: TestClient, name: str, value: str) -> None:
    r = client.put(f"/v1/projects/shop/secrets/{name}", json={"value": value})
    assert r.status_code == 201, r.text


def test_a_live_agent_nothing_can_answer_ends_the_gate_in_validating_saying_what_would(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    tmp_path: Path,
) -> None:
    bundle = bot(tmp_path / "p", "gemini/gemini-2.0-flash")
    gate, sandbox = judge(shop, settings, sessions, gateway, bundle)

    assert (gate["status"], gate["phase"]) == ("error", "validating"), gate
    reason = gate["failure_reason"]
    for said in (
        "'bot'",
        "gemini/gemini-2.0-flash",
        "GEMINI_API_KEY",
        "PUT /v1/projects/shop/secrets/GEMINI_API_KEY",
        "gate admin routes-set shop --route 'gemini/gemini-2.0-flash=URL#KEY_SECRET'",
        "tests/models/bot.py",
        "tests/recordings/bot/",
    ):
        assert said in reason, (said, reason)
    (problem,) = gate["problems"]
    assert {k: problem[k] for k in ("agent", "field", "model", "secret", "file")} == {
        "agent": "bot",
        "field": "model",
        "model": "gemini/gemini-2.0-flash",
        "secret": "GEMINI_API_KEY",
        "file": "agents/bot.yaml",
    }
    # Nothing was built and no case was stored or run.
    assert gate["cases"] == [] and gate["total_cases"] == 0
    assert sandbox.images == {} and sandbox.runs == []


def test_with_the_gateway_off_a_live_agent_ends_the_gate_in_validating(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    """GATE_MODEL_GATEWAY=false: no case can reach a provider, so a live agent is a
    configuration error before anything is built, not a red case; a scripted one runs."""
    put_secret(client, "GEMINI_API_KEY", "k")  # a key is no help without the gateway
    gate, sandbox = judge(shop, settings, sessions, None, bot(tmp_path / "p", "gemini/g-1"))
    assert (gate["status"], gate["phase"]) == ("error", "validating"), gate
    assert "model gateway is off (GATE_MODEL_GATEWAY=false)" in gate["failure_reason"]
    assert "tests/models/bot.py" in gate["failure_reason"]
    assert [p["agent"] for p in gate["problems"]] == ["bot"]
    assert sandbox.images == {} and sandbox.runs == []
    scripted = bot(tmp_path / "s", "gemini/g-1", scripted=True)
    gate, _ = judge(shop, settings, sessions, None, scripted)
    assert gate["status"] == "passed", gate


def test_with_the_provider_key_among_the_secrets_the_gate_runs(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    put_secret(client, "OPENAI_API_KEY", "sk-shop")
    put_secret(client, "OPENAI_API_BASE", provider.url)
    gate, _ = judge(shop, settings, sessions, gateway, bot(tmp_path / "p", "openai/gpt-4o"))
    assert gate["status"] == "passed", gate
    assert [auth for auth, _ in provider.calls] == ["Bearer sk-shop"]


def test_a_project_route_matching_the_model_is_enough(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    routes = [{"pattern": "gemini/*", "api_base": provider.url}]
    r = client.put("/v1/projects/shop/model-routes", json={"routes": routes})
    assert r.status_code == 200, r.text
    bundle = bot(tmp_path / "p", "gemini/gemini-2.0-flash")
    gate, _ = judge(shop, settings, sessions, gateway, bundle)
    assert gate["status"] == "passed", gate
    assert [body["model"] for _, body in provider.calls] == ["gemini/gemini-2.0-flash"]


def test_a_route_whose_key_secret_is_missing_names_that_secret(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    tmp_path: Path,
) -> None:
    routes = [{"pattern": "corp/*", "api_base": "http://llm-proxy:4000/v1", "key_secret": "CORP"}]
    assert client.put("/v1/projects/shop/model-routes", json={"routes": routes}).status_code == 200
    gate, _ = judge(shop, settings, sessions, gateway, bot(tmp_path / "p", "corp/llama-3"))
    assert (gate["status"], gate["phase"]) == ("error", "validating"), gate
    assert "key secret CORP" in gate["failure_reason"]
    assert gate["problems"][0]["secret"] == "CORP"


def test_a_fallback_model_without_a_key_is_named(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    provider: FakeProvider,
    tmp_path: Path,
) -> None:
    put_secret(client, "OPENAI_API_KEY", "sk-shop")
    put_secret(client, "OPENAI_API_BASE", provider.url)
    bundle = bot(tmp_path / "p", "openai/gpt-4o", fallback="anthropic/claude-3-5-haiku-latest")
    gate, _ = judge(shop, settings, sessions, gateway, bundle)

    assert (gate["status"], gate["phase"]) == ("error", "validating"), gate
    reason = gate["failure_reason"]
    assert "fallback_model anthropic/claude-3-5-haiku-latest" in reason
    assert "ANTHROPIC_API_KEY" in reason
    assert "openai/gpt-4o" not in reason  # the primary model has its key
    assert [(p["field"], p["secret"]) for p in gate["problems"]] == [
        ("fallback_model", "ANTHROPIC_API_KEY")
    ]
    assert provider.calls == []


def test_a_scripted_agent_needs_no_key_unless_the_gate_forces_live(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    tmp_path: Path,
) -> None:
    bundle = bot(tmp_path / "p", "gemini/gemini-2.0-flash", scripted=True)
    gate, _ = judge(shop, settings, sessions, gateway, bundle)
    assert gate["status"] == "passed", gate

    forced, _ = judge(shop, settings, sessions, gateway, bundle, model_mode="live")
    assert (forced["status"], forced["phase"]) == ("error", "validating"), forced
    assert "GEMINI_API_KEY" in forced["failure_reason"]
    assert "submit without model_mode=live" in forced["failure_reason"]


def test_a_gate_forced_to_replay_needs_no_key(
    client: TestClient,
    shop: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    gateway: ModelGateway,
    tmp_path: Path,
) -> None:
    bundle = bot(tmp_path / "p", "gemini/gemini-2.0-flash")
    gate, _ = judge(shop, settings, sessions, gateway, bundle, model_mode="replay")
    # Past validating: the case runs and fails on its missing recordings, no key asked.
    assert (gate["status"], gate["phase"]) == ("failed", "done"), gate
    (case,) = gate["cases"]
    assert "tests/recordings/bot/" in (case["failure_reason"] or "")

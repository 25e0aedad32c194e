"""Which models a gate's selected cases would call live (bundles/live_models.py), and what a
missing route lacks (gateway/keys.py ``unrouted``): the worker's check before any build."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_service.bundles.live_models import live_models
from gate_service.bundles.suites import validate_project
from gate_service.gateway import ModelRoute, unrouted
from tests.fixtures.projects import write


def llm(name: str, model: str, extra: str = "") -> str:
    return f"""
        version: "1.0"
        name: {name}
        description: An LLM agent.
        model: {model}
        system_prompt: Work.
        {extra}
    """


def case(agent: str) -> str:
    return f"""
        agent: {agent}
        tests:
          - name: runs
            payload: hi
    """


FILES = {
    "agents/first.yaml": llm("first", "openai/gpt-4o", "fallback_model: gemini/gemini-2.0-flash"),
    "agents/second.yaml": llm("second", "anthropic/claude-3-5-haiku-latest"),
    "agents/pipeline.yaml": """
        version: "1.0"
        name: pipeline
        description: Runs first, then second.
        type: sequential
        agents: [first, second]
    """,
    "agents/unused.yaml": llm("unused", "mistral/mistral-small"),
    "tests/pipeline.yaml": case("pipeline"),
}


def needed(root: Path, forced: str | None = None) -> list[tuple[str, str, str]]:
    report = validate_project(root)
    assert not report.problems, report.problems
    agents = {c.agent_name for c in report.cases}
    return [(m.agent, m.field, m.model) for m in live_models(root, report.configs, agents, forced)]


def test_a_sequential_agents_members_count_and_an_agent_no_case_reaches_does_not(
    tmp_path: Path,
) -> None:
    root = write(tmp_path, FILES)
    assert needed(root) == [
        ("first", "model", "openai/gpt-4o"),
        ("first", "fallback_model", "gemini/gemini-2.0-flash"),
        ("second", "model", "anthropic/claude-3-5-haiku-latest"),
    ]


def test_scripted_or_recorded_agents_are_not_live_unless_the_gate_forces_live(
    tmp_path: Path,
) -> None:
    root = write(
        tmp_path,
        {
            **FILES,
            "tests/models/first.py": "def respond(messages, tools, context):\n    return {}\n",
            "tests/recordings/second/k.json": "{}",
        },
    )
    assert needed(root) == []
    assert [agent for agent, _, _ in needed(root, "live")] == ["first", "first", "second"]
    assert needed(root, "scripted") == needed(root, "replay") == []


def test_a_bundle_that_names_trigger_agent_reaches_every_agent(tmp_path: Path) -> None:
    root = write(
        tmp_path,
        {
            **FILES,
            "tools/relay.py": """
                from connic.tools import trigger_agent

                async def relay(payload: dict) -> dict:
                    return await trigger_agent("unused", payload)
            """,
        },
    )
    assert ("unused", "model", "mistral/mistral-small") in needed(root)


@pytest.mark.parametrize(
    ("model", "secrets", "routes", "secret"),
    [
        ("gemini/gemini-2.0-flash", {}, (), "GEMINI_API_KEY"),
        ("azure/gpt-4o", {"AZURE_API_KEY": "k"}, (), "AZURE_API_BASE"),
        ("corp/llama", {}, (ModelRoute("corp/*", "http://proxy/v1", "CORP"),), "CORP"),
        ("nobody/model", {}, (), None),
        ("gpt-4o", {}, (), "OPENAI_API_KEY"),
    ],
)
def test_unrouted_names_the_secret_that_is_missing(
    model: str, secrets: dict[str, str], routes: tuple[ModelRoute, ...], secret: str | None
) -> None:
    provider_of = {"gpt-4o": "openai"}.get
    missing = unrouted(model, secrets, routes, provider_of=provider_of)
    assert missing is not None and missing.secret == secret
    assert model in missing.reason


def test_a_model_with_its_key_or_a_keyless_route_is_routed() -> None:
    assert unrouted("openai/gpt-4o", {"OPENAI_API_KEY": "k"}) is None
    assert unrouted("corp/llama", {}, (ModelRoute("corp/*", "http://proxy/v1"),)) is None

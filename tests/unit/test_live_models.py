"""Which models a gate's selected cases would call live (bundles/live_models.py), and what a
missing route lacks (gateway/keys.py ``unrouted``): the worker's check before any build."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_service.bundles.live_models import live_models, unjudged_warnings
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


# Issue 38, item 6: the project's judge model for judged guardrails.
JUDGED = {
    "agents/guarded.yaml": llm(
        "guarded",
        "openai/gpt-4o",
        "guardrails: {input: [{type: prompt_injection}, {type: regex, config: {patterns: [x]}}],"
        " output: [{type: relevance}, {type: prompt_injection}]}",
    ),
    "agents/lookup.yaml": """
        version: "1.0"
        name: lookup
        description: A tool agent with a judged guardrail.
        type: tool
        tool_name: calc.add
        guardrails: {input: [{type: topic_restriction, config: {topics: [billing]}}]}
    """,
    "agents/plain.yaml": llm("plain", "openai/gpt-4o"),
    # A rule may name its own judge model (config.model), which wins over the project's.
    "agents/own.yaml": llm(
        "own",
        "openai/gpt-4o",
        "guardrails: {input: [{type: prompt_injection}],"
        " output: [{type: relevance, config: {model: anthropic/claude-3-5-haiku-latest}}]}",
    ),
    "tools/calc.py": "def add(payload: dict) -> dict:\n    return payload\n",
    "tests/guarded.yaml": """
        agent: guarded
        tests:
          - name: blocks_spam_domain
            payload: hi
            expected_result: status == "blocked"
          - name: answers
            payload: hi
    """,
    "tests/lookup.yaml": case("lookup"),
    "tests/plain.yaml": case("plain"),
    "tests/own.yaml": case("own"),
}


def judges(
    root: Path, forced: str | None = None, judge: str | None = "openai/gpt-4o-mini"
) -> list[tuple[str, str, str, tuple[str, ...]]]:
    report = validate_project(root)
    assert not report.problems, report.problems
    agents = {c.agent_name for c in report.cases}
    return [
        (m.agent, m.field, m.model, m.guardrails)
        for m in live_models(root, report.configs, agents, forced, judge)
        if m.guardrails
    ]


def test_the_guardrail_model_is_needed_by_each_live_agent_with_a_judged_guardrail(
    tmp_path: Path,
) -> None:
    root = write(tmp_path, JUDGED)
    # Any kind of agent (a tool agent's guardrails run too); each rule once, in its order.
    assert judges(root) == [
        (
            "guarded",
            "guardrail_model",
            "openai/gpt-4o-mini",
            ("input prompt_injection", "output relevance", "output prompt_injection"),
        ),
        ("lookup", "guardrail_model", "openai/gpt-4o-mini", ("input topic_restriction",)),
        ("own", "guardrail_model", "openai/gpt-4o-mini", ("input prompt_injection",)),
        (
            "own",
            "guardrails.output.relevance.config.model",
            "anthropic/claude-3-5-haiku-latest",
            ("output relevance",),
        ),
    ]
    # No project judge model: only a rule's own is checked (the gate warns of the rest);
    # scripted or replay: no call.
    assert judges(root, judge=None) == [
        (
            "own",
            "guardrails.output.relevance.config.model",
            "anthropic/claude-3-5-haiku-latest",
            ("output relevance",),
        )
    ]
    assert judges(root, "scripted") == judges(root, "replay") == []
    scripted = write(
        tmp_path / "s",
        {**JUDGED, "tests/models/guarded.py": "def respond(m, t, c):\n    return {}\n"},
    )
    assert [agent for agent, *_ in judges(scripted)] == ["lookup", "own", "own"]
    assert [agent for agent, *_ in judges(scripted, "live")] == [
        "guarded",
        "lookup",
        "own",
        "own",
    ]


def warned(
    root: Path, forced: str | None = None, judge: str | None = None
) -> dict[str, dict[str, object]]:
    report = validate_project(root)
    assert not report.problems, report.problems
    found = unjudged_warnings(root, report.configs, report.cases, forced, judge, "shop")
    return {str(w["agent"]): w for w in found}


def test_without_a_guardrail_model_each_agent_is_warned_naming_rules_cases_and_fix(
    tmp_path: Path,
) -> None:
    root = write(tmp_path, JUDGED)
    warnings = warned(root)
    # Not `plain`: no judged guardrail. `own`: only its rule without a judge model.
    assert sorted(warnings) == ["guarded", "lookup", "own"]
    assert warnings["own"]["guardrails"] == ["input prompt_injection"]
    assert "the judged guardrail prompt_injection (input) is skipped" in str(
        warnings["own"]["message"]
    )
    guarded = warnings["guarded"]
    assert {k: guarded[k] for k in ("file", "key", "support", "cases", "more_cases")} == {
        "file": "agents/guarded.yaml",
        "key": "guardrails.judged",
        "support": "not_in_gate",
        "cases": ["tests/guarded.yaml::blocks_spam_domain", "tests/guarded.yaml::answers"],
        "more_cases": 0,
    }
    message = str(guarded["message"])
    for said in (
        "prompt_injection (input), relevance (output), prompt_injection (output)",
        "skipped in this gate and never block",
        "the project names no guardrail model",
        "tests/guarded.yaml::blocks_spam_domain, tests/guarded.yaml::answers",
        'PUT /v1/projects/shop/guardrail-model with {"model": MODEL}',
        "gate admin guardrail-model-set shop MODEL",
    ):
        assert said in message, (said, message)
    assert "scripted" not in message
    # With a judge model, live agents are judged: nothing to warn of.
    assert warned(root, judge="openai/gpt-4o-mini") == {}


def test_a_scripted_agents_judged_guardrails_are_warned_of_even_with_a_judge_model(
    tmp_path: Path,
) -> None:
    files = {**JUDGED, "tests/models/guarded.py": "def respond(m, t, c):\n    return {}\n"}
    root = write(tmp_path, files)
    message = str(warned(root, judge="openai/gpt-4o-mini")["guarded"]["message"])
    assert "runs its scripted model tests/models/guarded.py" in message
    assert "a scripted model calls no judge" in message
    assert "names no guardrail model" not in message
    assert "model_mode=live" in message
    forced = warned(root, "scripted", judge="openai/gpt-4o-mini")
    assert sorted(forced) == ["guarded", "lookup", "own"]
    # Scripted, even a rule's own judge model is not asked; naming one would not help.
    own = forced["own"]
    assert own["guardrails"] == ["input prompt_injection", "output relevance"]
    assert "guardrail-model-set" not in str(own["message"])
    assert "submit without model_mode=scripted" in str(forced["lookup"]["message"])
    # Without one, both reasons and both fixes.
    both = str(warned(root)["guarded"]["message"])
    assert "scripted" in both and "names no guardrail model" in both
    assert "gate admin guardrail-model-set shop MODEL" in both


def test_the_cases_a_warning_names_are_capped_and_counted(tmp_path: Path) -> None:
    many = "\n".join(f"  - name: c{i:02}\n    payload: hi" for i in range(25))
    files = {
        **JUDGED,
        "tests/guarded.yaml": f"agent: guarded\ntests:\n{many}\n",
        # A sequential agent's cases run its members: they could change too.
        "agents/flow.yaml": """
            version: "1.0"
            name: flow
            description: Runs guarded.
            type: sequential
            agents: [guarded]
        """,
        "tests/flow.yaml": case("flow"),
    }
    root = write(tmp_path, files)
    guarded = warned(root)["guarded"]
    cases = guarded["cases"]
    assert isinstance(cases, list) and len(cases) == 10
    assert guarded["more_cases"] == 16  # 25 of its own and flow's one
    assert "and 16 more" in str(guarded["message"])

"""One rule for attempts (decided, issue 39; docs/semantics.md, Retries): without
`retry_options` a model request gets 3 attempts (the SDK's RetryOptions default) and a tool
or sequential agent's operation gets 1; with them, their `attempts` count. A scripted
`respond()` that raises is a failed request: it is asked again, at once, up to those
attempts, except for a context-window refusal; with a `fallback_model` the primary is tried
once and the attempts are the fallback's.

The real runner in-process (forked invocations); scripted models, and a fake gateway for the
live request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from connic import AgentConfig, RetryOptions

from gate_runner.invocations import Isolation
from gate_runner.runtime.retries import model_request_attempts, operation_attempts
from tests.fixtures.fake_gateway import FakeGateway
from tests.fixtures.projects import write
from tests.fixtures.runner import judged

# A tool that fails every time, saying how many times it has been called in this invocation.
ALWAYS_FAILS = """
    CALLS = []


    def run(payload: dict) -> dict:
        CALLS.append(1)
        raise RuntimeError(f"broken on call {len(CALLS)}")
"""


def tool_project(root: Path, retry: str = "") -> Path:
    return write(
        root,
        {
            "agents/breaks.yaml": f"""
                version: "1.0"
                name: breaks
                description: Its tool always raises.
                type: tool
                tool_name: always_fails.run
                {retry}
            """,
            "agents/chain.yaml": """
                version: "1.0"
                name: chain
                description: One stage that breaks.
                type: sequential
                agents: [breaks]
            """,
            "tools/always_fails.py": ALWAYS_FAILS,
            "tests/breaks.yaml": """
                tests:
                  - name: fails
                    payload: '{}'
                    expected_result: status == "failed"
            """,
            "tests/chain.yaml": """
                tests:
                  - name: fails
                    payload: '{}'
                    expected_result: status == "failed"
            """,
        },
    )


def tool_calls(root: Path, agent: str) -> tuple[str, int]:
    result = judged(root, f"tests/{agent}.yaml", "fails")
    assert result.passed, result.failure_reason
    inv = result.invocations[0]
    return inv.error or "", sum(1 for s in inv.traces if s.type == "tool_call")


def test_a_tool_that_raises_is_called_once_without_retry_options(tmp_path: Path) -> None:
    error, spans = tool_calls(tool_project(tmp_path / "p"), "breaks")
    assert "broken on call 1" in error and spans == 1


def test_a_chain_without_retry_options_runs_its_failing_step_once(tmp_path: Path) -> None:
    error, spans = tool_calls(tool_project(tmp_path / "p"), "chain")
    assert "broken on call 1" in error and spans == 1


def test_an_llm_agents_tool_that_raises_is_called_once_its_error_going_to_the_model(
    tmp_path: Path,
) -> None:
    # Even with retry_options: an LLM agent's attempts are its model requests' (spec:
    # "the request and tool-reflection budget"); a tool's error goes back to the model.
    root = write(
        tmp_path / "p",
        {
            "agents/asker.yaml": """
                version: "1.0"
                name: asker
                description: Calls a tool that raises.
                model: openai/main
                system_prompt: Be brief.
                tools: [always_fails.run]
                retry_options: {attempts: 3, initial_delay: 0, max_delay: 1}
            """,
            "tools/always_fails.py": ALWAYS_FAILS,
            "tests/models/asker.py": """
                def respond(messages, tools, context):
                    results = [m["content"] for m in messages if m["role"] == "tool"]
                    if not results:
                        return {"tool_calls": [{"name": "run", "arguments": {"payload": {}}}]}
                    return {"content": results[-1]}
            """,
            "tests/asker.yaml": """
                tests:
                  - name: answers
                    payload: hi
                    expected_result: 'output.error == "RuntimeError: broken on call 1"'
            """,
        },
    )
    result = judged(root, "tests/asker.yaml", "answers")
    assert result.passed, result.failure_reason
    assert sum(1 for s in result.invocations[0].traces if s.type == "tool_call") == 1


def test_with_retry_options_a_tool_agent_gets_the_given_attempts(tmp_path: Path) -> None:
    root = tool_project(
        tmp_path / "p", "retry_options: {attempts: 3, initial_delay: 0, max_delay: 1}"
    )
    error, spans = tool_calls(root, "breaks")
    assert "broken on call 3" in error and spans == 3


def test_the_rule_as_the_sdks_configs_carry_it() -> None:
    def config(**fields: object) -> AgentConfig:
        return AgentConfig(version="1.0", name="a", description="d", model="openai/x",
                           system_prompt="s", **fields)  # fmt: skip

    absent = config()
    assert (model_request_attempts(absent), operation_attempts(absent)) == (3, 1)
    # Given retry_options without `attempts` are the SDK's default, 3, for both.
    given = config(retry_options=RetryOptions(initial_delay=0))
    assert (model_request_attempts(given), operation_attempts(given)) == (3, 3)
    five = config(retry_options=RetryOptions(attempts=5))
    assert (model_request_attempts(five), operation_attempts(five)) == (5, 5)


def test_a_live_request_without_retry_options_asks_the_gateway_for_3_attempts(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    root = write(
        tmp_path / "p",
        {
            "agents/bare.yaml": """
                version: "1.0"
                name: bare
                description: No retry_options.
                model: openai/gpt-4o
                system_prompt: Be brief.
            """,
            "tests/bare.yaml": """
                tests:
                  - name: answers
                    payload: hi
                    expected_result: status == "completed"
            """,
        },
    )
    result = judged(
        root,
        "tests/bare.yaml",
        "answers",
        isolation=Isolation(gateway=fake_gateway.channel),
        fresh=fake_gateway.rewind,
    )
    assert result.passed, result.failure_reason
    assert [r["attempts"] for r in fake_gateway.requests] == [3]


# A script that fails its first `FAILS` requests and then answers with every model it was
# asked, in order: a script that counts calls sees the retries.
SCRIPT = """
    import json

    ASKED = []


    def respond(messages, tools, context, options):
        ASKED.append(options["model"])
        if options["model"] == "openai/primary" or len(ASKED) <= FAILS:
            raise RuntimeError("down, asked so far: " + json.dumps(ASKED))
        return {"content": json.dumps(ASKED)}
"""


def scripted_project(
    root: Path, fails: int, agent_extra: str, script: str = SCRIPT, model: str = "openai/main"
) -> Path:
    return write(
        root,
        {
            "agents/bot.yaml": (
                'version: "1.0"\nname: bot\ndescription: Asks a flaky script.\n'
                f"model: {model}\nsystem_prompt: Be brief.\n{agent_extra}\n"
            ),
            "tests/models/bot.py": script.replace("FAILS", str(fails)),
            "tests/bot.yaml": """
                tests:
                  - name: asks
                    payload: hi
                    expected_result: status == "completed"
            """,
        },
    )


def asked(root: Path) -> tuple[bool, str, list[dict[str, object]]]:
    result = judged(root, "tests/bot.yaml", "asks")
    inv = result.invocations[0]
    spans = [s.metadata for s in inv.traces if s.type == "model_call"]
    return result.passed, str(inv.output if result.passed else inv.error), spans


def test_a_scripted_request_that_raises_is_tried_3_times_without_retry_options(
    tmp_path: Path,
) -> None:
    passed, output, [span] = asked(scripted_project(tmp_path / "p", 2, ""))
    assert passed and json.loads(output) == ["openai/main"] * 3
    assert span["attempts"] == 3  # one request, three tries: one span that says so
    passed, error, _ = asked(scripted_project(tmp_path / "q", 3, ""))
    assert not passed and "down, asked so far: " + json.dumps(["openai/main"] * 3) in error


@pytest.mark.parametrize(("attempts", "passes"), [(3, True), (1, False)])
def test_a_script_raising_once_passes_with_attempts_3_and_fails_with_1(
    tmp_path: Path, attempts: int, passes: bool
) -> None:
    retry = f"retry_options: {{attempts: {attempts}, initial_delay: 10, max_delay: 30}}"
    passed, output, _ = asked(scripted_project(tmp_path / "p", 1, retry))
    assert passed is passes, output
    if passes:
        assert json.loads(output) == ["openai/main", "openai/main"]  # no backoff: in a test's time
    else:
        assert 'down, asked so far: ["openai/main"]' in output


@pytest.mark.parametrize(("attempts", "passes"), [(3, True), (1, False)])
def test_with_a_fallback_the_primary_is_tried_once_and_the_attempts_are_the_fallbacks(
    tmp_path: Path, attempts: int, passes: bool
) -> None:
    # SDK connic/core.py RetryOptions.attempts: "with a fallback, the primary is tried once
    # and this budget applies to the fallback" (spec, fallback_model: "the primary is tried
    # once and the fallback receives the retry budget"). The script fails the primary every
    # time and the fallback's first try (its request number 2).
    retry = f"fallback_model: openai/backup\nretry_options: {{attempts: {attempts}}}"
    passed, output, spans = asked(
        scripted_project(tmp_path / "p", 2, retry, model="openai/primary")
    )
    assert passed is passes, output
    if passes:
        assert json.loads(output) == ["openai/primary", "openai/backup", "openai/backup"]
        assert [(s["model"], s.get("attempts")) for s in spans] == [
            ("openai/primary", None),
            ("openai/backup", 2),
        ]
    else:
        assert 'down, asked so far: ["openai/primary", "openai/backup"]' in output


def test_a_context_window_refusal_is_not_retried(tmp_path: Path) -> None:
    script = """
        ASKED = []


        def respond(messages, tools, context):
            ASKED.append(1)
            if len(ASKED) == FAILS:
                raise RuntimeError("maximum context length exceeded, try " + str(len(ASKED)))
            return {"content": "answered"}
    """
    passed, error, _ = asked(scripted_project(tmp_path / "p", 1, "", script))
    assert not passed and "maximum context length exceeded, try 1" in error


def test_a_reply_that_is_no_completion_is_not_retried(tmp_path: Path) -> None:
    script = """
        ASKED = []


        def respond(messages, tools, context):
            ASKED.append(1)
            return {} if len(ASKED) == FAILS else {"content": "answered"}
    """
    passed, error, _ = asked(scripted_project(tmp_path / "p", 1, "", script))
    assert not passed and "returned neither content nor tool_calls" in error

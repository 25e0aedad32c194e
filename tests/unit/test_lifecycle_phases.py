"""Lifecycle phases (issue 19): middleware `cleanup` (item 1), what `after` sees in the run
context (item 4), and the points item 11 decided: `connector_id`, the params a hook's `after`
receives, hooks and guardrails around tool and sequential agents."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_runner.contract import CaseResult
from tests.fixtures.projects import write
from tests.fixtures.runner import judged

CLEANUP = {
    "agents/lister.yaml": """
        version: "1.0"
        name: lister
        description: An LLM agent with all three middleware phases.
        model: openai/gpt-4o
        system_prompt: List.
        tools: [notes.count]
    """,
    "agents/counter.yaml": """
        version: "1.0"
        name: counter
        description: A tool agent with all three middleware phases.
        type: tool
        tool_name: notes.tally
    """,
    "tools/notes.py": """
        def count(folder: str, context: dict) -> dict:
            # Spec 4.4: token_usage and duration_ms are added when execution finishes.
            return {"n": 3, "early": sorted(k for k in ("duration_ms", "token_usage") if k in context)}


        def tally(payload: dict, context: dict) -> dict:
            if payload.get("fail"):
                raise RuntimeError("tally failed")
            return {"n": 1, "connector": ("connector_id" in context, context["connector_id"])}
    """,
    "middleware/lister.py": """
        import json


        def before(content, context):
            return content


        def after(response, context):
            return json.dumps({"answer": json.loads(response), "duration_ms": context["duration_ms"],
                               "token_usage": context["token_usage"]})


        def cleanup(run, context):
            if context["payload"].get("message") == "raise":
                raise RuntimeError("cleanup broke")
            context["cleanup_saw"] = {"status": run["status"], "error": run["error"],
                                      "output": run["output"]}
    """,
    "middleware/counter.py": """
        def before(content, context):
            return content


        def after(response, context):
            return response.replace('"n"', '"ms_known": %s, "n"' % ("duration_ms" in context and "token_usage" in context).__str__().lower())


        def cleanup(run, context):
            context["cleanup_saw"] = {"status": run["status"], "error": run["error"]}
    """,
    "tests/models/lister.py": """
        def respond(messages, tools, context):
            done = [m for m in messages if m["role"] == "tool"]
            if not done:
                return {"tool_calls": [{"name": "count", "arguments": {"folder": "inbox"}}],
                        "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
            return {"content": done[0]["content"], "usage": {"prompt_tokens": 11, "completion_tokens": 2}}
    """,
    "tests/mocks/no_cleanup_mock.py": """
        def middleware_before(content, context):
            return content


        def middleware_after(response, context):
            return response
    """,
    "tests/mocks/cleanup_mock.py": """
        def middleware_cleanup(run, context):
            context["cleanup_mocked"] = run["status"]
    """,
    "tests/lister.yaml": """
        tests:
          - name: cleanup_runs_last
            payload: list
            expected_result: >-
              output.answer.n == 3 and output.answer.early == []
              and output.token_usage == {"prompt_tokens": 18, "completion_tokens": 5, "total_tokens": 23}
              and output.duration_ms >= 0
          - name: strict_flag_without_a_cleanup_mock
            payload: list
            mocks: no_cleanup_mock
            strict_middleware_mocks: true
          - name: a_cleanup_mock_replaces_it
            payload: list
            mocks: cleanup_mock
            strict_middleware_mocks: false
          - name: cleanup_errors_never_change_the_status
            payload: raise
            expected_result: status == "completed"
    """,
    "tests/counter.yaml": """
        tests:
          - name: tool_agent_phases
            payload: '{}'
            expected_result: output.ms_known == true and output.connector == [true, null]
          - name: cleanup_after_a_failed_run
            payload: '{"fail": true}'
            expected_result: status == "failed"
    """,
}


@pytest.fixture(scope="module")
def cleanup_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("cleanup") / "p", CLEANUP)


def middleware_spans(case: CaseResult) -> list[tuple[str, str]]:
    return [(s.name, s.status) for s in case.invocations[0].traces if s.type == "middleware"]


def test_cleanup_runs_last_with_the_runs_end(cleanup_project: Path) -> None:
    case = judged(cleanup_project, "tests/lister.yaml", "cleanup_runs_last")
    assert case.passed, case.failure_reason
    inv = case.invocations[0]
    assert inv.run_context["cleanup_saw"] == {
        "status": "completed",
        "error": None,
        "output": inv.output,
    }
    assert middleware_spans(case) == [
        ("middleware.before", "ok"),
        ("middleware.after", "ok"),
        ("middleware.cleanup", "ok"),
    ]
    assert [s.type for s in inv.traces if s.type != "log"][-1] == "middleware"  # last of all


def test_strict_middleware_mocks_covers_cleanup(cleanup_project: Path) -> None:
    case = judged(cleanup_project, "tests/lister.yaml", "strict_flag_without_a_cleanup_mock")
    assert case.invocations[0].failed_assertions == [
        "strict_middleware_mocks: the real middleware cleanup() would run for lister; the "
        "mocks module has no replacement for it"
    ]
    assert "cleanup_saw" not in case.invocations[0].run_context  # failed just before it ran


def test_a_cleanup_mock_replaces_the_phase(cleanup_project: Path) -> None:
    case = judged(cleanup_project, "tests/lister.yaml", "a_cleanup_mock_replaces_it")
    assert case.passed, case.failure_reason
    context = case.invocations[0].run_context
    assert context["cleanup_mocked"] == "completed" and "cleanup_saw" not in context


def test_cleanup_errors_are_logged_and_never_change_the_status(cleanup_project: Path) -> None:
    case = judged(cleanup_project, "tests/lister.yaml", "cleanup_errors_never_change_the_status")
    assert case.passed, case.failure_reason
    assert ("middleware.cleanup", "error") in middleware_spans(case)
    logged = [s.metadata["message"] for s in case.invocations[0].traces if s.type == "log"]
    assert any("cleanup broke" in line for line in logged), logged


def test_tool_agents_run_cleanup_and_see_the_finished_runs_keys(cleanup_project: Path) -> None:
    ok = judged(cleanup_project, "tests/counter.yaml", "tool_agent_phases")
    assert ok.passed, ok.failure_reason
    assert ok.invocations[0].run_context["cleanup_saw"] == {"status": "completed", "error": None}
    failed = judged(cleanup_project, "tests/counter.yaml", "cleanup_after_a_failed_run")
    assert failed.passed, failed.failure_reason
    assert failed.invocations[0].run_context["cleanup_saw"] == {
        "status": "failed",
        "error": "RuntimeError: tally failed",
    }


# -- item 11: hooks around a tool agent's own tool, and the params `after` receives ---------

HOOKED = {
    "agents/hooked.yaml": """
        version: "1.0"
        name: hooked
        description: A tool agent behind tool hooks.
        type: tool
        tool_name: body.work
    """,
    "agents/adder.yaml": """
        version: "1.0"
        name: adder
        description: An LLM agent whose before hook changes b.
        model: openai/gpt-4o
        system_prompt: Add.
        tools: [body.add]
    """,
    "tools/body.py": """
        def work(payload: dict) -> dict:
            return {"got": payload}


        def add(a: int, b: int) -> int:
            return a + b
    """,
    "hooks/hooked.py": """
        from connic import AbortTool


        def before(tool_name, params, context):
            if params["payload"].get("abort"):
                raise AbortTool({"aborted": tool_name})
            return {"payload": {**params["payload"], "by_hook": True}}


        def after(tool_name, params, result, context):
            return {**result, "after_saw": params}
    """,
    "hooks/adder.py": """
        def before(tool_name, params, context):
            return {"b": 10}


        def after(tool_name, params, result, context):
            return {"sum": result, "after_saw": params}
    """,
    "tests/models/adder.py": """
        import json


        def respond(messages, tools, context):
            done = [m for m in messages if m["role"] == "tool"]
            if not done:
                return {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}
            return {"content": done[0]["content"]}
    """,
    "tests/mocks/tool_only.py": """
        def mock(tool_name, params, context):
            return {"mocked": True}
    """,
    "tests/hooked.yaml": """
        tests:
          - name: hooks_wrap_the_body_tool
            payload: '{"x": 1}'
            expected_result: >-
              output.got == {"x": 1, "by_hook": true}
              and output.after_saw == {"payload": {"x": 1}}
            expected_tool_calls: [{work: params.by_hook == true}]
          - name: abort_tool_gives_the_output
            payload: '{"abort": true}'
            expected_result: output.aborted == "work"
          - name: strict_hook_mocks_covers_them
            payload: '{"x": 1}'
            mocks: tool_only
            strict_hook_mocks: true
    """,
    "tests/adder.yaml": """
        tests:
          - name: after_gets_the_original_params
            payload: add
            expected_result: 'output.sum == 11 and output.after_saw == {"a": 1, "b": 2}'
            expected_tool_calls: [{add: params.b == 10}]
    """,
}


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("hooked") / "p", HOOKED)


@pytest.mark.parametrize(
    ("suite", "case"),
    [
        ("tests/hooked.yaml", "hooks_wrap_the_body_tool"),
        ("tests/hooked.yaml", "abort_tool_gives_the_output"),
        ("tests/adder.yaml", "after_gets_the_original_params"),
    ],
)
def test_hook_decisions(hooked: Path, suite: str, case: str) -> None:
    result = judged(hooked, suite, case)
    assert result.passed, result.failure_reason


def test_strict_hook_mocks_covers_a_tool_agents_hooks(hooked: Path) -> None:
    result = judged(hooked, "tests/hooked.yaml", "strict_hook_mocks_covers_them")
    assert result.invocations[0].failed_assertions == [
        "strict_hook_mocks: the real hook before() would run for body.work; the mocks module "
        "has no replacement for it"
    ]


# -- item 11: guardrails run around tool and sequential agents too ------------------------

GUARDED_TOOLS = {
    "agents/echo.yaml": """
        version: "1.0"
        name: echo
        description: A tool agent behind guardrails.
        type: tool
        tool_name: echoes.echo
        guardrails:
          input:
            - type: regex
              config: {patterns: [{pattern: "(?i)drop table"}], rejection_message: "No SQL."}
            - {type: pii, mode: redact, config: {entities: [email]}}
          output:
            - {type: pii_leakage, mode: redact, config: {entities: [ssn]}}
    """,
    "agents/chain.yaml": """
        version: "1.0"
        name: chain
        description: A chain behind an output guardrail.
        type: sequential
        agents: [echo]
        guardrails:
          output:
            - type: regex
              config: {patterns: [{pattern: "secret"}], rejection_message: "Withheld."}
    """,
    "tools/echoes.py": """
        def echo(payload: dict) -> dict:
            return {"heard": payload, "ssn": "123-45-6789"}
    """,
    "tests/echo.yaml": """
        tests:
          - name: input_block
            payload: '{"q": "DROP TABLE users"}'
            expected_result: status == "blocked" and output == "No SQL."
          - name: input_redaction_reaches_the_tool
            payload: '{"q": "mail ann@example.com"}'
            expected_result: >-
              output.heard.q == "mail [EMAIL_REDACTED]" and output.ssn == "[SSN_REDACTED]"
    """,
    "tests/chain.yaml": """
        tests:
          - name: output_block_on_the_chain
            payload: '{"q": "the secret"}'
            expected_result: status == "blocked" and output == "Withheld."
    """,
}


@pytest.fixture(scope="module")
def guarded_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("guarded-tools") / "p", GUARDED_TOOLS)


@pytest.mark.parametrize(
    ("suite", "case", "verdicts"),
    [
        ("tests/echo.yaml", "input_block", ["blocked"]),
        ("tests/echo.yaml", "input_redaction_reaches_the_tool", ["passed", "redacted", "redacted"]),
        # echo's own rules run as a stage of the chain, then the chain's output rule.
        (
            "tests/chain.yaml",
            "output_block_on_the_chain",
            ["passed", "passed", "redacted", "blocked"],
        ),
    ],
)
def test_guardrails_run_for_tool_and_sequential_agents(
    guarded_tools: Path, suite: str, case: str, verdicts: list[str]
) -> None:
    result = judged(guarded_tools, suite, case)
    assert result.passed, result.failure_reason
    ran = [s.status for s in result.invocations[0].traces if s.type == "guardrail"]
    assert ran == verdicts


def test_no_middleware_cleanup_for_a_run_left_awaiting_approval(tmp_path: Path) -> None:
    # Decided (issue 39): a run left waiting for an approval has not ended (SDK Middleware:
    # cleanup "runs last, once the run has ended"); the platform would resume it, and a gate
    # never does, so its cleanup does not run, and strict_middleware_mocks has nothing to
    # check there.
    files = dict(CLEANUP)
    files["agents/lister.yaml"] = CLEANUP["agents/lister.yaml"].replace(
        "tools: [notes.count]\n", "tools: [notes.count]\n        approval: {tools: [notes.count]}\n"
    )
    files["tests/lister.yaml"] = """
        tests:
          - name: waits
            payload: list
            expected_result: status == "awaiting_approval"
          - name: waits_strictly
            payload: list
            mocks: no_cleanup_mock
            strict_middleware_mocks: true
            expected_result: status == "awaiting_approval"
    """
    root = write(tmp_path / "p", files)
    case = judged(root, "tests/lister.yaml", "waits")
    assert case.passed, case.failure_reason
    assert "cleanup_saw" not in case.invocations[0].run_context
    assert ("middleware.cleanup", "ok") not in middleware_spans(case)
    strict = judged(root, "tests/lister.yaml", "waits_strictly")
    assert strict.passed, strict.failure_reason

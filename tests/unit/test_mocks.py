"""Mocks: the resolution ladders, replacement only, the four strict flags, and mocked calls
checked against the real signature."""

from pathlib import Path

import pytest

from gate_runner.contract import CaseResult
from gate_runner.mocks import normalise
from tests.fixtures.projects import mock_project
from tests.fixtures.runner import judged as judge


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mock_project(tmp_path_factory.mktemp("mocks") / "p")


def judged(project: Path, case: str) -> CaseResult:
    return judge(project, "tests/crm-bot.yaml", case)


def test_name_normalisation() -> None:
    assert normalise("api:weather-v2.lookup") == ["api", "weather_v2", "lookup"]
    assert normalise("domain-check") == ["domain_check"]


def test_every_phase_mocked_under_all_strict_flags(project: Path) -> None:
    result = judged(project, "every_phase_mocked_under_all_strict_flags")
    assert result.passed, result.failure_reason
    spans = result.invocations[0].traces
    assert [s.metadata["mocked"] for s in spans if s.type == "tool_call"] == [True, True]
    assert result.invocations[0].run_context["middleware_mocked"] is True


def test_lenient_mode_runs_real_phases_and_mocked_tools(project: Path) -> None:
    result = judged(project, "lenient_without_mocks_runs_the_real_code")
    assert result.passed, result.failure_reason


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (
            "mocked_call_with_a_mistyped_argument_fails",
            "mocked call to data.customer.add_customer does not fit its signature: argument 'age' "
            "should be int, got str",
        ),
        (
            "strict_mocks_without_a_tool_mock",
            "strict_mocks: data.customer.add_customer would run for real",
        ),
        (
            "strict_hook_mocks_without_a_hook_mock",
            "strict_hook_mocks: the real hook before() would run for data.customer.add_customer",
        ),
        (
            "strict_middleware_mocks_without_a_middleware_mock",
            "strict_middleware_mocks: the real middleware before() would run for crm-bot",
        ),
        (
            "strict_guardrail_mocks_without_a_guardrail_mock",
            "strict_guardrail_mocks: the real custom guardrail 'domain-check' would run (input)",
        ),
    ],
)
def test_violations_fail_the_invocation(project: Path, case: str, reason: str) -> None:
    result = judged(project, case)
    assert not result.passed
    failures = result.invocations[0].failed_assertions
    # Said once (issue 10, rule 8): not again as "agent error: ..." of the failed run.
    assert [f for f in failures if reason in f] == [failures[0]] and len(failures) == 1, failures


# -- issue 19, item 8: mock names keep every segment as it is ------------------------------

NOTES = {
    "agents/notes-bot.yaml": """
        version: "1.0"
        name: notes-bot
        description: Lists notes with a tool whose name ends in an underscore.
        model: openai/gpt-4o
        system_prompt: Notes.
        tools: [notes.list_, notes.list]
    """,
    "tools/notes.py": """
        def list_(folder: str) -> dict:
            return {"real": "list_"}


        def list(folder: str) -> dict:
            return {"real": "list"}
    """,
    "tests/models/notes-bot.py": """
        import json


        def respond(messages, tools, context):
            done = [m for m in messages if m["role"] == "tool"]
            if not done:
                return {"tool_calls": [{"name": "list_", "arguments": {"folder": "inbox"}}]}
            return {"content": done[0]["content"]}
    """,
    # mock_notes_list is the mock of notes.list, not of notes.list_.
    "tests/mocks/notes_mocks.py": """
        def mock_notes_list(tool_name, params, context):
            return {"mocked_by": "mock_notes_list", "tool_name": tool_name}
    """,
    "tests/mocks/trailing_mocks.py": """
        def mock_notes_list_(tool_name, params, context):
            return {"mocked_by": "mock_notes_list_", "tool_name": tool_name}


        def mock_notes_list(tool_name, params, context):
            return {"mocked_by": "mock_notes_list", "tool_name": tool_name}
    """,
    "tests/notes-bot.yaml": """
        tests:
          - name: a_sibling_tools_mock_does_not_serve_it
            payload: list
            mocks: notes_mocks
            strict_mocks: true
          - name: its_own_mock_serves_it
            payload: list
            mocks: trailing_mocks
            strict_mocks: true
            expected_result: output.mocked_by == "mock_notes_list_" and output.tool_name == "notes.list_"
    """,
}


def test_a_trailing_underscore_is_part_of_the_mock_name(tmp_path: Path) -> None:
    from tests.fixtures.projects import write

    assert normalise("notes.list_") == ["notes", "list_"]
    assert normalise("api:weather--v2.look-up") == ["api", "weather_v2", "look_up"]
    project = write(tmp_path / "p", NOTES)
    served = judge(project, "tests/notes-bot.yaml", "its_own_mock_serves_it")
    assert served.passed, served.failure_reason
    # Stripping the `_` would let mock_notes_list serve notes.list_, and strict_mocks pass.
    refused = judge(project, "tests/notes-bot.yaml", "a_sibling_tools_mock_does_not_serve_it")
    assert refused.invocations[0].failed_assertions == [
        "strict_mocks: notes.list_ would run for real; no mock in the mocks module matches it "
        "(most specific first: mock_notes_list_)"
    ]

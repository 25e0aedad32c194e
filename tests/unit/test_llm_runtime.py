"""LLM agents with scripted models: the loop, tools, hooks, middleware, children, limits."""

from pathlib import Path

import pytest

from tests.fixtures.projects import llm_project
from tests.fixtures.runner import judged


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return llm_project(tmp_path / "proj")


def test_tool_calls_hooks_and_a_waited_child_agent(project: Path) -> None:
    result = judged(project, "tests/assistant.yaml", "adds_with_hooked_params_and_a_child")
    assert result.passed, result.failure_reason
    inv = result.invocations[0]
    spans = inv.traces
    kinds = [s.type for s in spans]
    assert kinds.count("model_call") == 2
    add = next(s for s in spans if s.type == "tool_call" and s.name == "add_numbers")
    assert add.metadata["params"] == {"a": 2, "b": 13}  # after the before-hook
    assert add.metadata["result"] == 15
    child = next(s for s in spans if s.type == "child_agent")
    assert child.metadata["status"] == "completed"
    child_agent = next(s for s in spans if s.type == "agent" and s.parent_span_id == child.span_id)
    assert child_agent.name == "calc"
    assert inv.run_context["middleware_saw"] == "add please"
    hook = next(s for s in spans if s.type == "hook")
    assert (hook.name, hook.parent_span_id) == ("hook.before", add.span_id)
    assert [s.name for s in spans if s.type == "middleware"] == [
        "middleware.before",
        "middleware.after",
    ]


def test_stop_processing_from_a_tool_completes_with_its_message(project: Path) -> None:
    result = judged(project, "tests/assistant.yaml", "stop_processing_ends_the_run_completed")
    assert result.passed, result.failure_reason
    assert result.invocations[0].status == "completed"


def test_abort_tool_skips_the_call_and_marks_the_span(project: Path) -> None:
    result = judged(project, "tests/assistant.yaml", "abort_tool_hands_its_result_to_the_model")
    assert result.passed, result.failure_reason
    span = next(s for s in result.invocations[0].traces if s.type == "tool_call")
    assert (span.status, span.metadata["aborted"]) == ("error", True)


def test_output_schema_violations_fail_the_run(project: Path) -> None:
    result = judged(project, "tests/assistant.yaml", "output_schema_violation_fails")
    assert result.passed, result.failure_reason


def test_max_iterations_is_enforced(project: Path) -> None:
    result = judged(project, "tests/loops.yaml", "max_iterations_is_enforced")
    assert result.passed, result.failure_reason
    assert [s.type for s in result.invocations[0].traces].count("model_call") == 3


def test_replay_mode_hits_and_misses(project: Path) -> None:
    import json

    from gate_runner.models import request_key

    (project / "tests/models/loops.py").unlink()
    recordings = project / "tests/recordings/loops"
    recordings.mkdir(parents=True)
    request = {
        "model": "openai/gpt-4o",
        "messages": [{"role": "system", "content": "loop"}, {"role": "user", "content": "go"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "add_numbers",
                    "description": "Add two integers.\n\nArgs:\n    a: the first\n    b: the second",
                    "parameters": None,
                },
            }
        ],
        "temperature": 1.0,
    }
    (recordings / "one.json").write_text(
        json.dumps({"request": request, "response": {"content": "done"}})
    )
    result = judged(project, "tests/loops.yaml", "max_iterations_is_enforced")
    error = result.invocations[0].error or ""
    # The recorded tool schema above is deliberately wrong: the whole request is the key.
    assert "no recording for this request" in error and "model openai/gpt-4o" in error
    assert request_key(request) != ""


def test_replay_mode_answers_from_a_recording_of_the_whole_request(project: Path) -> None:
    import json

    from connic import ProjectLoader

    from gate_runner.runtime import tool_schema

    (project / "tests/models/loops.py").unlink()
    recordings = project / "tests/recordings/loops"
    recordings.mkdir(parents=True)
    agent = next(a for a in ProjectLoader(str(project)).load_agents() if a.config.name == "loops")
    tools = [tool_schema(t) for t in agent.tools]
    first = {
        "model": "openai/gpt-4o",
        "messages": [{"role": "system", "content": "loop"}, {"role": "user", "content": "go"}],
        "tools": tools,
        "temperature": 1.0,
    }
    (recordings / "first.json").write_text(
        json.dumps({"request": first, "response": {"content": "replayed answer"}})
    )
    result = judged(project, "tests/loops.yaml", "max_iterations_is_enforced")
    inv = result.invocations[0]
    assert (inv.status, inv.output) == ("completed", "replayed answer")
    # A different temperature is a different request: it must miss, not reuse the answer.
    first["temperature"] = 0.5
    (recordings / "first.json").write_text(
        json.dumps({"request": first, "response": {"content": "replayed answer"}})
    )
    again = judged(project, "tests/loops.yaml", "max_iterations_is_enforced").invocations[0]
    assert again.status == "failed" and "no recording for this request" in (again.error or "")


def test_tool_agents_retry_per_retry_options_with_fresh_state_per_invocation(project: Path) -> None:
    result = judged(project, "tests/second-try.yaml", "retries_until_it_works")
    assert result.passed, result.failure_reason
    agent_span = result.invocations[1].traces[0]
    assert agent_span.metadata["retries"] == 1


def test_scripted_and_replay_modes_never_import_the_provider_library(project: Path) -> None:
    import subprocess
    import sys

    script = (
        "import sys, pathlib\n"
        "from connic import ProjectLoader\n"
        "from gate_runner.runtime import Runtime, Trace, install_predefined\n"
        "project = pathlib.Path(sys.argv[1])\n"
        "rt = Runtime({}, project=project)\n"
        "install_predefined(rt)\n"
        "loader = ProjectLoader(str(project))\n"
        "rt.agents = {a.config.name: a for a in loader.load_agents()}\n"
        "rt.loader = loader\n"
        "out = rt.run('assistant', {'message': 'add please'}, Trace())\n"
        "print(out.status, 'litellm' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(project)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": "runner_image", "PATH": "/usr/bin:/bin"},
    )
    # The last line is ours; the child agent prints its own log line before it.
    assert proc.stdout.splitlines()[-1].split() == ["completed", "False"], proc.stderr


@pytest.mark.parametrize(
    ("suite", "case"),
    [
        ("tests/assistant.yaml", "after_hook_replaces_the_result"),
        ("tests/careless.yaml", "middleware_returning_none_fails_the_run"),
    ],
)
def test_hook_and_middleware_contracts(project: Path, suite: str, case: str) -> None:
    result = judged(project, suite, case)
    assert result.passed, result.failure_reason

"""A triggered child's own `timeout` and a sequential stage's are kept, as the agent under
test's is (issue 19, item 5). Each case waits out one 5 s timeout (the SDK's minimum)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.projects import write
from tests.fixtures.runner import judged

TIMED = {
    "agents/slowpoke.yaml": """
        version: "1.0"
        name: slowpoke
        description: Sleeps longer than its own timeout.
        type: tool
        tool_name: slow.nap
        timeout: 5
    """,
    "agents/dispatcher.yaml": """
        version: "1.0"
        name: dispatcher
        description: Waits for slowpoke.
        type: tool
        tool_name: slow.dispatch
    """,
    "agents/chain.yaml": """
        version: "1.0"
        name: chain
        description: slowpoke, then an echo.
        type: sequential
        agents: [slowpoke, echo]
    """,
    "agents/echo.yaml": """
        version: "1.0"
        name: echo
        description: Echoes.
        type: tool
        tool_name: slow.echo
    """,
    "agents/worker.yaml": """
        version: "1.0"
        name: worker
        description: An LLM child whose first tool outlasts its timeout.
        model: openai/gpt-4o
        system_prompt: Work.
        timeout: 5
        tools: [slow.wait, slow.record]
    """,
    "agents/boss.yaml": """
        version: "1.0"
        name: boss
        description: Waits for worker, then stays long enough to see what worker does next.
        type: tool
        tool_name: slow.boss
    """,
    "tools/slow.py": """
        import time

        from connic.tools import trigger_agent


        def nap(payload: dict) -> str:
            time.sleep(payload["seconds"])
            return "slept"


        def echo(payload: dict) -> dict:
            return payload


        async def dispatch(payload: dict) -> dict:
            done = await trigger_agent("slowpoke", {"seconds": 8}, timeout_seconds=60)
            return {"status": done["status"], "error": done.get("error")}


        def wait(seconds: int) -> str:
            time.sleep(seconds)
            return "waited"


        def record() -> str:
            return "recorded"


        async def boss(payload: dict) -> dict:
            done = await trigger_agent("worker", "go", timeout_seconds=60)
            time.sleep(3)  # past the moment worker's wait returns
            return {"status": done["status"]}
    """,
    "tests/models/worker.py": """
        def respond(messages, tools, context):
            done = [m for m in messages if m["role"] == "tool"]
            if not done:
                return {"tool_calls": [{"name": "wait", "arguments": {"seconds": 6}}]}
            if len(done) == 1:
                return {"tool_calls": [{"name": "record", "arguments": {}}]}
            return {"content": "done"}
    """,
    "tests/dispatcher.yaml": """
        tests:
          - name: the_childs_timeout_is_kept
            payload: '{}'
            expected_child_agents:
              slowpoke: {expected_result: output == "slept"}
    """,
    "tests/chain.yaml": """
        tests:
          - name: the_stages_timeout_is_kept
            payload: '{"seconds": 8}'
            expected_result: output == "slept"
    """,
    "tests/boss.yaml": """
        tests:
          - name: a_timed_out_child_makes_no_more_calls
            payload: '{}'
            expected_result: output.status == "failed"
    """,
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("timeouts") / "p", TIMED)


@pytest.mark.slow
def test_a_triggered_childs_own_timeout_fails_its_run(project: Path) -> None:
    case = judged(project, "tests/dispatcher.yaml", "the_childs_timeout_is_kept")
    (reason,) = case.invocations[0].failed_assertions
    assert reason == (
        "expected_child_agents slowpoke: none of 1 waited trigger(s) met the whole entry; the "
        "closest (trigger 1 of 1): agent error: agent 'slowpoke' timed out after 5 s (its "
        "timeout: 5)"
    ), reason
    assert case.invocations[0].output == {
        "status": "failed",
        "error": "agent 'slowpoke' timed out after 5 s (its timeout: 5)",
    }


@pytest.mark.slow
def test_a_sequential_stages_own_timeout_fails_the_chain(project: Path) -> None:
    case = judged(project, "tests/chain.yaml", "the_stages_timeout_is_kept")
    assert case.invocations[0].failed_assertions == [
        "agent error: agent 'slowpoke' timed out after 5 s (its timeout: 5)"
    ]
    stages = [s.name for s in case.invocations[0].traces if s.type == "agent"]
    assert stages == ["chain", "slowpoke"]  # echo never started


@pytest.mark.slow
def test_a_timed_out_child_makes_no_more_calls(project: Path) -> None:
    case = judged(project, "tests/boss.yaml", "a_timed_out_child_makes_no_more_calls")
    assert case.passed, case.failure_reason
    called = [s.name for s in case.invocations[0].traces if s.type == "tool_call"]
    # boss's body, worker's wait; the record call its model asked for after the timeout
    # was refused before it was made.
    assert called == ["boss", "wait"], called


@pytest.mark.slow
def test_timeout_s_includes_build(tmp_path: Path) -> None:
    # Decided (issue 19, item 11): TestDefaults.timeout_s is the "per-run wall-clock timeout"
    # of an invocation, which build() is part of (builders run "once per invocation").
    project = write(
        tmp_path / "p",
        {
            "agents/echo.yaml": TIMED["agents/echo.yaml"],
            "tools/slow.py": TIMED["tools/slow.py"],
            "tests/builders/slow_build.py": """
                import time


                def build(context, builder_args, test_name, payload, files):
                    time.sleep(30)
                    return {}
            """,
            "tests/echo.yaml": """
                tests:
                  - name: build_outlasts_timeout_s
                    builder: slow_build
                    timeout_s: 2
                    expected_result: status == "failed"
            """,
        },
    )
    case = judged(project, "tests/echo.yaml", "build_outlasts_timeout_s")
    assert case.invocations[0].error == "timed out after 2 s (timeout_s)"
    assert case.invocations[0].traces == []  # the agent never started

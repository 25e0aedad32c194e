"""Edge cases of the runner's verdicts, each named for the property it guards."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_runner.assertions import ToolCall, check_tool_calls, compile_assertions
from gate_runner.expr import accessor_values, compile_expression
from tests.fixtures.projects import AGENTS, write
from tests.fixtures.runner import judged


def test_a_shorter_dotted_suffix_names_a_nested_tool() -> None:
    a = compile_assertions(
        {
            "expected_tool_calls": ["calculator.add", "add", "math.calculator.add"],
            "expected_tool_call_order": ["calculator.add"],
        }
    )
    call = ToolCall(name="add", ref="math.calculator.add", params={})
    assert check_tool_calls(a, [call, call, call], {}) == []
    b = compile_assertions({"expected_tool_calls": ["lator.add"]})
    assert check_tool_calls(b, [call], {}) != []  # a suffix must start at a dot


def test_describing_a_failed_assertion_never_raises() -> None:
    expr = compile_expression("output[output.keys] == 1", ("output",))
    seen = dict(accessor_values(expr, {"output": {"keys": [1, 2]}}))
    assert "TypeError" in seen["output[output.keys]"]


def test_a_broken_setup_fails_even_a_status_failed_expectation(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            **AGENTS,
            "tests/mocks/broken.py": "raise ImportError('no such library')\n",
            "tests/calc.yaml": """
            tests:
              - name: broken_mocks
                payload: '{"a": 1, "b": 1}'
                mocks: broken
                expected_result: status == "failed" and error != null
        """,
        },
    )
    result = judged(project, "tests/calc.yaml", "broken_mocks")
    assert not result.passed
    assert "the mocks module 'broken' raised ImportError: no such library" in (
        result.failure_reason or ""
    )


def test_children_triggered_in_parallel_each_get_their_own_parent(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            **AGENTS,
            "agents/fan.yaml": """
            version: "1.0"
            name: fan
            description: Triggers three children at once.
            type: tool
            tool_name: fan.out
        """,
            "tools/fan.py": """
            import asyncio

            from connic.tools import trigger_agent


            async def out(payload: dict) -> dict:
                done = await asyncio.gather(*[trigger_agent("calc", {"a": i, "b": 1}) for i in range(3)])
                return {"sums": sorted(d["response"]["sum"] for d in done)}
        """,
            "tests/fan.yaml": """
            tests:
              - name: three_at_once
                payload: '{}'
                expected_result: output.sums == [1, 2, 3]
                expected_child_agents:
                  calc:
                    expected_triggered: 3
                    expected_payload: payload.a == 2
                    expected_result: output.sum == 3
        """,
        },
    )
    result = judged(project, "tests/fan.yaml", "three_at_once", spans_in_order=False)
    assert result.passed, result.failure_reason
    spans = result.invocations[0].traces
    children = [s for s in spans if s.type == "child_agent"]
    agents = [s for s in spans if s.type == "agent" and s.name == "calc"]
    assert {a.parent_span_id for a in agents} == {c.span_id for c in children}


def test_an_attempted_call_still_occurred(tmp_path: Path) -> None:
    # Issue 10, rule 4 (spec 6.3: a name that "occurs in the invocation"): the model called a
    # tool hidden from it; the tool never received the call, and it still counts for
    # expected_no_tool_calls. Issue 19, item 6: it is in expected_tool_calls' list too, and
    # only a `result` predicate tells it from a call that returned.
    project = write(
        tmp_path / "p",
        {
            "agents/clerk.yaml": """
            version: "1.0"
            name: clerk
            description: Has a tool only admins see.
            model: openai/gpt-4o
            system_prompt: x
            tools:
              - admin.refund: context.admin == true
        """,
            "tools/admin.py": "def refund(amount: int) -> int:\n    return amount\n",
            "tests/models/clerk.py": """
            def respond(messages, tools, context):
                if any(m["role"] == "tool" for m in messages):
                    return {"content": "done"}
                return {"tool_calls": [{"name": "refund", "arguments": {"amount": 5}}]}
        """,
            "tests/clerk.yaml": """
            tests:
              - name: hidden_tool_was_not_called
                payload: hi
                expected_no_tool_calls: [refund]
              - name: hidden_tool_was_called
                payload: hi
                expected_tool_calls: [refund, {refund: params.amount == 5 and invocations == 1}]
              - name: hidden_tool_returned
                payload: hi
                expected_tool_calls: [{refund: result == 5}]
        """,
        },
    )
    result = judged(project, "tests/clerk.yaml", "hidden_tool_was_not_called")
    assert result.invocations[0].failed_assertions == [
        "expected no call to refund, saw 1 (0 executed; called 1 time(s), not executed "
        "(unknown or hidden tool))"
    ]
    span = next(s for s in result.invocations[0].traces if s.type == "tool_call")
    assert (span.status, span.metadata["executed"]) == ("error", False)
    called = judged(project, "tests/clerk.yaml", "hidden_tool_was_called")
    assert called.passed, called.failure_reason
    returned = judged(project, "tests/clerk.yaml", "hidden_tool_returned")
    assert returned.invocations[0].failed_assertions == [
        'expected a call to refund with `result == 5`; saw 1 call(s): refund({"amount": 5}) -> '
        "no recorded return; it was called 1 time(s), not executed (unknown or hidden tool)"
    ]


@pytest.mark.slow
def test_a_hanging_cleanup_runs_once_and_keeps_the_agents_result(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    project = write(
        tmp_path / "p",
        {
            **AGENTS,
            "tests/builders/slow_cleanup.py": f"""
            import os
            import time


            def build(context, builder_args, test_name, payload, files):
                return {{"a": 1, "b": 2}}


            def cleanup(run, context, builder_args):
                open(os.path.join({str(marks)!r}, str(os.getpid())), "w").write("x")
                time.sleep(30)
        """,
            "tests/calc.yaml": """
            tests:
              - name: cleanup_hangs
                builder: slow_cleanup
                timeout_s: 2
                expected_result: output.sum == 3
        """,
        },
    )
    result = judged(
        project,
        "tests/calc.yaml",
        "cleanup_hangs",
        fresh=lambda: [m.unlink() for m in marks.iterdir()],
    )
    inv = result.invocations[0]
    assert inv.output == {"sum": 3}
    assert inv.failed_assertions == ["builder cleanup timed out after 2 s"]
    assert len(list(marks.iterdir())) == 1  # never run a second time


def test_no_strict_middleware_violation_for_an_after_that_will_not_run(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            "agents/quiet.yaml": """
            version: "1.0"
            name: quiet
            description: Blocks without running after().
            model: openai/gpt-4o
            system_prompt: x
            guardrails:
              run_after_on_block: false
              input:
                - {type: regex, config: {patterns: [{pattern: "forbidden"}]}}
        """,
            "middleware/quiet.py": """
            def before(content, context):
                return content


            def after(response, context):
                return response
        """,
            "tests/models/quiet.py": "def respond(messages, tools, context):\n    return {'content': 'x'}\n",
            "tests/mocks/before_only.py": "def middleware_before(content, context):\n    return content\n",
            "tests/quiet.yaml": """
            tests:
              - name: blocked_before_anything_ran
                payload: this is forbidden
                mocks: before_only
                strict_middleware_mocks: true
                expected_result: status == "blocked"
        """,
        },
    )
    result = judged(project, "tests/quiet.yaml", "blocked_before_anything_ran")
    assert result.passed, result.failure_reason


@pytest.mark.slow
def test_a_waited_child_past_timeout_seconds_answers_timeout(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            **AGENTS,
            "agents/impatient.yaml": """
            version: "1.0"
            name: impatient
            description: Waits one second for a slow child.
            type: tool
            tool_name: waiter.run
        """,
            "tools/waiter.py": """
            from connic.tools import trigger_agent


            async def run(payload: dict) -> dict:
                done = await trigger_agent("calc", {"a": 1, "b": 1, "sleep": 20}, timeout_seconds=1)
                return {"status": done["status"]}
        """,
            "tests/impatient.yaml": """
            tests:
              - name: child_times_out
                payload: '{}'
                timeout_s: 15
                expected_result: output.status == "timeout"
        """,
        },
    )
    result = judged(project, "tests/impatient.yaml", "child_times_out")
    # The trigger's own timeout answered, not the case's timeout_s (which would fail the run).
    assert result.passed, result.failure_reason
    assert result.invocations[0].status == "completed"


def test_middleware_runs_around_tool_agents_and_reruns_on_retries(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            "agents/guarded-tool.yaml": """
            version: "1.0"
            name: guarded-tool
            description: A tool agent behind middleware.
            type: tool
            tool_name: once.run
            retry_options: {attempts: 2, initial_delay: 0, max_delay: 1, rerun_middleware: true}
        """,
            "tools/once.py": """
            CALLS = []


            def run(payload: dict, context: dict) -> dict:
                CALLS.append(1)
                if len(CALLS) == 1:
                    raise RuntimeError("first attempt fails")
                return {"attempts": len(CALLS), "seen_by_before": context["before_calls"]}
        """,
            "middleware/guarded-tool.py": """
            from connic import StopProcessing


            def before(content, context):
                if "deny" in content["parts"][0]["text"]:
                    raise StopProcessing("denied by middleware")
                context["before_calls"] = context.get("before_calls", 0) + 1
                return content


            def after(response, context):
                return response.replace("attempts", "tries")
        """,
            "tests/guarded-tool.yaml": """
            tests:
              - name: retried_with_middleware_rerun
                payload: '{"ok": 1}'
                expected_result: output.tries == 2 and output.seen_by_before == 2
              - name: middleware_can_stop_the_run
                payload: '{"deny": 1}'
                expected_result: output == "denied by middleware"
        """,
        },
    )
    for case in ("retried_with_middleware_rerun", "middleware_can_stop_the_run"):
        result = judged(project, "tests/guarded-tool.yaml", case)
        assert result.passed, (case, result.failure_reason)
    inv = judged(project, "tests/guarded-tool.yaml", "retried_with_middleware_rerun").invocations[0]
    assert inv.run_context["retry_attempt"] == 1

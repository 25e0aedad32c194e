"""Attempted calls (issue 10, rule 4; issue 19, item 6): a call the model made still occurred,
even when a hook or an approval stopped it before the tool received it: it counts for every
tool assertion, `invocations` included, and matches no `result` predicate; reasons say so."""

from pathlib import Path

import pytest

from tests.fixtures.projects import APPROVAL_PROJECT, write
from tests.fixtures.runner import judged

WIPER = {
    "agents/wiper.yaml": """
        version: "1.0"
        name: wiper
        description: Asks to wipe a table.
        model: openai/gpt-4o
        system_prompt: Wipe.
        tools: [db.delete_all]
    """,
    "tools/db.py": """
        def delete_all(table: str) -> dict:
            raise AssertionError("the tool must never receive this call")
    """,
    "tests/models/wiper.py": """
        def respond(messages, tools, context):
            if any(m["role"] == "tool" for m in messages):
                return {"content": "done"}
            return {"tool_calls": [{"name": "delete_all", "arguments": {"table": "charges"}}]}
    """,
    "tests/wiper.yaml": """
        tests:
          - name: no_wipe
            payload: go
            expected_no_tool_calls: [delete_all]
          - name: no_wipe_counted
            payload: go
            expected_tool_calls: [{delete_all: invocations == 0}]
          - name: wipe_counted_with_the_params_sent
            payload: go
            expected_tool_calls: [delete_all, {delete_all: params.table == "charges" and invocations == 1}]
          - name: wipe_returned
            payload: go
            expected_tool_calls: [{delete_all: result.deleted == "charges"}]
    """,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "hook",
    [
        "from connic import AbortTool\n\n\ndef before(tool_name, params, context):\n"
        "    raise AbortTool({'refused': True})\n",
        "def before(tool_name, params, context):\n    raise ValueError('no wiping today')\n",
    ],
    ids=["abort_tool", "plain_exception"],
)
def test_a_call_a_before_hook_stopped_still_occurred(tmp_path: Path, hook: str) -> None:
    project = write(tmp_path / "p", {**WIPER, "hooks/wiper.py": hook})
    no_wipe = judged(project, "tests/wiper.yaml", "no_wipe")
    assert no_wipe.invocations[0].failed_assertions == [
        "expected no call to delete_all, saw 1 (0 executed; called 1 time(s), not executed "
        "(aborted by hook))"
    ]
    span = next(s for s in no_wipe.invocations[0].traces if s.type == "tool_call")
    assert (span.metadata["executed"], span.metadata["aborted"]) == (False, True)
    # `invocations == 0` passed on a run whose only call was aborted (issue 19, item 6).
    counted = judged(project, "tests/wiper.yaml", "no_wipe_counted")
    assert counted.invocations[0].failed_assertions == [
        "expected_tool_calls delete_all: `invocations == 0` was false (invocations = 1; "
        "counted calls include ones called 1 time(s), not executed (aborted by hook))"
    ]
    sent = judged(project, "tests/wiper.yaml", "wipe_counted_with_the_params_sent")
    assert sent.passed, sent.failure_reason
    returned = judged(project, "tests/wiper.yaml", "wipe_returned")
    assert returned.invocations[0].failed_assertions == [
        'expected a call to delete_all with `result.deleted == "charges"`; saw 1 call(s): '
        'delete_all({"table": "charges"}) -> no recorded return; it was called 1 time(s), not '
        "executed (aborted by hook)"
    ]


def test_a_call_an_approval_refused_still_occurred(tmp_path: Path) -> None:
    project = write(
        tmp_path / "p",
        {
            **APPROVAL_PROJECT,
            "tests/refused.yaml": """
                agent: payments-lenient
                tests:
                  - name: refused_refund
                    payload: go
                    approval_decisions: [{tool: billing.refund, decision: reject}]
                    expected_no_tool_calls: [refund]
            """,
        },
    )
    result = judged(project, "tests/refused.yaml", "refused_refund")
    assert result.invocations[0].failed_assertions == [
        "expected no call to refund, saw 1 (0 executed; called 1 time(s), not executed "
        "(refused by approval))"
    ]

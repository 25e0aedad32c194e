"""`expected_tool_calls` edge cases, decided (issue 39) and pinned: what an empty list, a
count of zero, a filter nothing fits and repeated entries mean (docs/semantics.md, "Tool-call
entries")."""

from __future__ import annotations

from typing import Any

import pytest

from gate_runner.assertions import calls_in_scope, check_tool_calls, compile_assertions

ROOT = {"span_id": "s1", "parent_span_id": None, "type": "agent", "name": "f", "metadata": {}}


def add_call(index: int, a: int) -> dict[str, Any]:
    return {
        "span_id": f"s{index}",
        "parent_span_id": "s1",
        "type": "tool_call",
        "name": "add",
        "metadata": {
            "tool_name": "add",
            "tool_ref": "calc.add",
            "params": {"a": a, "b": 1},
            "result": a + 1,
        },
    }


CALLS = calls_in_scope([ROOT, add_call(2, 1), add_call(3, 5)], None)


@pytest.mark.parametrize(
    "entries",
    [
        [],  # an empty list asserts nothing
        [{"send": "invocations == 0"}],  # a count of zero holds for a tool never called
        [{"add": "params.a == 9 and invocations == 0"}],  # no call fits the filter
        [{"add": "invocations == 2"}, {"add": "params.a == 5"}],  # a count claims no call
        [{"add": "invocations >= 1"}, "add", "add"],  # two bare entries, two calls
    ],
)
def test_these_hold(entries: list[Any]) -> None:
    assert check_tool_calls(compile_assertions({"expected_tool_calls": entries}), CALLS, {}) == []


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        (["send"], "expected a call to send; it was never called"),
        (
            [{"add": "params.a == 1 and invocations == 0"}],
            "expected_tool_calls add: `params.a == 1 and invocations == 0` was false "
            "(invocations = 1)",
        ),
        # Each filtering or bare entry needs a call of its own (bipartite matching).
        ([{"add": "params.a == 1"}, {"add": "params.a == 1"}], "claimed by other entries"),
        (["add", "add", "add"], "claimed by other entries"),
    ],
)
def test_these_fail(entries: list[Any], reason: str) -> None:
    (failure,) = check_tool_calls(compile_assertions({"expected_tool_calls": entries}), CALLS, {})
    assert reason in failure

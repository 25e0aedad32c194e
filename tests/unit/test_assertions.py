"""expected_result short-circuiting and the tool-call assertions."""

from gate_runner.assertions import (
    ToolCall,
    check_result,
    check_tool_calls,
    compile_assertions,
)
from gate_runner.expr import compile_expression

RESULT = ("output", "error", "status", "context")


def result(source: str | None, **kw: object) -> str | None:
    expr = compile_expression(source, RESULT) if source else None
    base: dict[str, object] = {"status": "completed", "output": None, "error": None, "context": {}}
    base.update(kw)
    return check_result(expr, **base)  # type: ignore[arg-type]


def test_agent_error_short_circuits_expressions_that_ignore_status() -> None:
    assert result("output.ok", status="failed", error="boom") == "agent error: boom"


def test_expression_mentioning_status_decides_alone() -> None:
    assert result('status == "failed"', status="failed", error="boom") is None


def test_expression_mentioning_error_decides_alone() -> None:
    assert result('"timed out" in error', status="failed", error="timed out after 1 s") is None


def test_no_expression_requires_completed() -> None:
    assert result(None) is None
    reason = result(None, status="blocked")
    assert reason is not None and "'blocked'" in reason


def test_json_string_output_is_decoded() -> None:
    assert result("output.id == 10", output='{"id": 10}') is None


def test_plain_string_output_stays_a_string() -> None:
    assert result('"hi" in output', output="hi there") is None


def test_false_assertion_reports_the_value_seen() -> None:
    reason = result("output.total == 42", output={"total": 41})
    assert reason == "expected_result `output.total == 42` was false (seen: output.total = 41)"


def test_runtime_error_fails_with_expression_and_error() -> None:
    reason = result("output.total > 1", output={"other": 1})
    assert reason is not None
    assert "`output.total > 1` could not be evaluated" in reason and "no key total" in reason


def calls(*specs: tuple[str, dict[str, object]]) -> list[ToolCall]:
    return [ToolCall(name=ref.rsplit(".", 1)[-1], ref=ref, params=p) for ref, p in specs]


def test_bare_and_qualified_names_match() -> None:
    a = compile_assertions({"expected_tool_calls": ["add", "math.calculator.add"]})
    assert check_tool_calls(a, calls(("math.calculator.add", {})), {}) == [
        "expected a call to math.calculator.add; its 1 call(s) were all claimed by other entries: add({})"
    ]
    assert (
        check_tool_calls(a, calls(("math.calculator.add", {}), ("math.calculator.add", {})), {})
        == []
    )


def test_params_filter_and_invocations_count() -> None:
    a = compile_assertions({"expected_tool_calls": [{"add": "params.a == 1 and invocations == 2"}]})
    two = calls(("m.add", {"a": 1}), ("m.add", {"a": 1}), ("m.add", {"a": 2}))
    assert check_tool_calls(a, two, {}) == []
    one = calls(("m.add", {"a": 1}), ("m.add", {"a": 2}))
    assert check_tool_calls(a, one, {}) == [
        "expected_tool_calls add: `params.a == 1 and invocations == 2` was false (invocations = 1)"
    ]


def test_repeated_entries_need_distinct_calls_matched_optimally() -> None:
    # A greedy pass would give the first call to the looser entry and fail the second.
    a = compile_assertions(
        {"expected_tool_calls": [{"f": "params.x >= 1"}, {"f": "params.x == 1"}]}
    )
    assert check_tool_calls(a, calls(("m.f", {"x": 1}), ("m.f", {"x": 2})), {}) == []
    assert len(check_tool_calls(a, calls(("m.f", {"x": 1})), {})) == 1


def test_order_is_a_subsequence() -> None:
    a = compile_assertions({"expected_tool_call_order": ["a", "c"]})
    assert check_tool_calls(a, calls(("m.a", {}), ("m.b", {}), ("m.c", {})), {}) == []
    assert check_tool_calls(a, calls(("m.c", {}), ("m.a", {})), {}) != []


def test_no_tool_calls() -> None:
    a = compile_assertions({"expected_no_tool_calls": ["email.send"]})
    assert check_tool_calls(a, calls(("email.send", {})), {}) == [
        "expected no call to email.send, saw 1"
    ]
    assert check_tool_calls(a, calls(("m.other", {})), {}) == []


def test_unmatched_filter_shows_the_params_seen_and_evaluation_errors() -> None:
    a = compile_assertions({"expected_tool_calls": [{"refund": "params.charge_id == 'ch_1'"}]})
    failures = check_tool_calls(
        a, calls(("billing.refund", {"charge_id": "ch_2"}), ("billing.refund", {})), {}
    )
    assert failures == [
        "expected a call to refund with `params.charge_id == 'ch_1'`; saw 2 call(s): "
        'refund({"charge_id": "ch_2"}), refund({}); `params.charge_id == \'ch_1\'` could not be '
        "evaluated: no key charge_id in {}"
    ]


def test_never_called_says_so() -> None:
    a = compile_assertions({"expected_tool_calls": ["email.send"]})
    assert check_tool_calls(a, [], {}) == ["expected a call to email.send; it was never called"]

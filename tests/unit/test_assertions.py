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
        "expected a call to math.calculator.add; the 1 call(s) that fit it were all claimed by "
        "other entries of expected_tool_calls (each entry needs a call of its own): add({})"
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


# -- issue 10, rule 3: an error in a tool-call filter is not "no match" --------------------


def tool_failures(
    entries: list[object], calls: list[ToolCall], context: dict[str, object]
) -> list[str]:
    return check_tool_calls(compile_assertions({"expected_tool_calls": entries}), calls, context)


def test_a_filter_error_that_is_not_the_calls_fails_the_entry() -> None:
    # The typo makes every call's filter raise; counting zero matches would pass the entry.
    calls = [ToolCall("delete_all", "db.delete_all", {"table": "charges"})]
    entry = {"delete_all": "params.table == context.charge_tabel and invocations == 0"}
    (failure,) = tool_failures([entry], calls, {"charge_table": "charges"})
    assert failure.startswith(
        "expected_tool_calls delete_all: `params.table == context.charge_tabel` could not be "
        "evaluated: no key charge_tabel"
    ), failure


def test_a_key_missing_from_one_calls_params_is_no_match_for_that_call_only() -> None:
    calls = [
        ToolCall("refund", "pay.refund", {"amount": 5}),
        ToolCall("refund", "pay.refund", {"amount": 7, "reason": "dup"}),
    ]
    assert tool_failures([{"refund": 'params.reason == "dup"'}], calls, {}) == []
    assert (
        tool_failures([{"refund": 'params.reason == "dup" and invocations == 1'}], calls, {}) == []
    )
    # With no call carrying the key, there is simply no match (and no evaluation failure).
    (failure,) = tool_failures([{"refund": 'params.note == "x"'}], calls[:1], {})
    assert "saw 1 call(s)" in failure and "could not be evaluated" in failure
    assert tool_failures([{"refund": 'params.note == "x" and invocations == 0'}], calls, {}) == []


def test_a_key_missing_deeper_inside_params_is_still_the_calls() -> None:
    calls = [ToolCall("send", "mail.send", {"to": {"name": "Ann"}})]
    assert (
        tool_failures([{"send": 'params.to.email == "a@x" and invocations == 0'}], calls, {}) == []
    )


# -- issue 10, rule 2: one waited trigger satisfies the whole expected_child_agents entry ---


def child_span(span_id: str, a: int, total: int) -> dict[str, object]:
    return {
        "span_id": span_id,
        "parent_span_id": "root",
        "type": "child_agent",
        "name": "adder",
        "metadata": {
            "payload": {"a": a},
            "wait_for_response": True,
            "status": "completed",
            "output": {"sum": total},
        },
    }


def children_failures(spans: list[dict[str, object]]) -> list[str]:
    from gate_runner.assertions import check_children

    compiled = compile_assertions(
        {
            "expected_child_agents": {
                "adder": {
                    "expected_payload": "payload.a == 1",
                    "expected_result": "output.sum == 10",
                }
            }
        }
    )
    root = {"span_id": "root", "parent_span_id": None, "type": "agent", "name": "p", "metadata": {}}
    return check_children(compiled.expected_child_agents, [root, *spans], {})


def test_payload_and_result_must_hold_on_the_same_trigger() -> None:
    # One trigger had a == 1, another summed to 10: neither satisfies the whole entry.
    (failure,) = children_failures([child_span("c1", 1, 3), child_span("c2", 2, 10)])
    assert failure.startswith(
        "expected_child_agents adder: none of 2 waited trigger(s) met the whole entry; the "
        "closest (trigger 1 of 2): expected_result `output.sum == 10` was false"
    ), failure


def test_one_trigger_satisfying_everything_is_enough() -> None:
    assert children_failures([child_span("c1", 2, 3), child_span("c2", 1, 10)]) == []


# -- issue 10, rule 8: reasons carry the key fact ------------------------------------------


def test_a_crash_under_a_status_expression_shows_the_agents_error() -> None:
    reason = result('status == "completed"', status="failed", error="KeyError: 'sku'")
    assert reason == (
        'expected_result `status == "completed"` was false (seen: status = "failed"; agent '
        "error: KeyError: 'sku')"
    )


def test_a_blocked_run_carries_the_rules_rejection_message() -> None:
    reason = result("output.ok", status="blocked", output="No prompt games.")
    assert reason == (
        "the run ended with status 'blocked', expected 'completed' (a guardrail blocked it: "
        "No prompt games.)"
    )


def test_a_fitting_call_taken_by_another_entry_says_so() -> None:
    a = compile_assertions({"expected_tool_calls": [{"add": "params.a == 1"}, "add"]})
    two = calls(("m.add", {"a": 1}), ("m.add", {"a": 2}))
    assert check_tool_calls(a, two, {}) == []
    one = calls(("m.add", {"a": 1}))
    (failure,) = check_tool_calls(a, one, {})
    assert "claimed by other entries" in failure


def test_the_order_sees_attempted_calls_and_says_so() -> None:
    # Issue 19, item 6: a call the model made is in the trace's order, executed or not.
    refused = ToolCall(
        "refund", "pay.refund", {}, executed=False, not_executed="refused by approval"
    )
    lookup = ToolCall("lookup", "crm.lookup", {})
    a = compile_assertions({"expected_tool_call_order": ["lookup", "refund"]})
    assert check_tool_calls(a, [lookup, refused], {}) == []
    (failure,) = check_tool_calls(a, [refused, lookup], {})
    assert failure == (
        "expected_tool_call_order ['lookup', 'refund'] not met: refund missing after "
        "['lookup'] (calls: pay.refund (not executed), crm.lookup); refund was called 1 "
        "time(s), not executed (refused by approval)"
    ), failure

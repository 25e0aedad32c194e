"""`result` in expected_tool_calls (issue 19, item 7) and which filter errors are one call's
own (item 11): the tool's return after its after hook, no match for a call without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_runner.assertions import (
    ToolCall,
    calls_in_scope,
    check_result,
    check_tool_calls,
    compile_assertions,
)
from gate_runner.expr import ExpressionError, compile_expression
from gate_service.bundles.suites import validate_project
from tests.fixtures.projects import write
from tests.fixtures.runner import judged

SHOP = {
    "agents/shop.yaml": """
        version: "1.0"
        name: shop
        description: Quotes three skus.
        model: openai/gpt-4o
        system_prompt: Quote.
        tools: [pricing.quote]
    """,
    "tools/pricing.py": """
        def quote(sku: str) -> dict:
            if sku == "C":
                raise LookupError("no price for C")
            return {"price": 10}
    """,
    # The after hook doubles B's price: `result` is what the hook handed on.
    "hooks/shop.py": """
        def after(tool_name, params, result, context):
            if params["sku"] == "B":
                return {"price": result["price"] * 2}
            return None
    """,
    "tests/models/shop.py": """
        def respond(messages, tools, context):
            if any(m["role"] == "tool" for m in messages):
                return {"content": "quoted"}
            return {"tool_calls": [
                {"name": "quote", "arguments": {"sku": sku}} for sku in ("A", "B", "C")
            ]}
    """,
    "tests/shop.yaml": """
        tests:
          - name: results_after_the_after_hook
            payload: quote
            expected_tool_calls:
              - quote: params.sku == "B" and result.price == 20
              - quote: result.price == 10 and invocations == 1
              - quote: params.sku == "C" and invocations == 1
          - name: a_raised_call_has_no_recorded_return
            payload: quote
            expected_tool_calls:
              - quote: params.sku == "C" and result == null
          - name: the_hook_did_not_change_a
            payload: quote
            expected_tool_calls:
              - quote: params.sku == "A" and result.price == 20
    """,
}


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("shop") / "p", SHOP)


def test_intake_accepts_result_in_tool_call_expressions(shop: Path) -> None:
    report = validate_project(shop)
    assert report.problems == [] and len(report.cases) == 3, report.problems


def test_result_is_the_return_after_the_after_hook(shop: Path) -> None:
    case = judged(shop, "tests/shop.yaml", "results_after_the_after_hook")
    assert case.passed, case.failure_reason


def test_a_call_without_a_recorded_return_matches_no_result_predicate(shop: Path) -> None:
    raised = judged(shop, "tests/shop.yaml", "a_raised_call_has_no_recorded_return")
    assert raised.invocations[0].failed_assertions == [
        'expected a call to quote with `params.sku == "C" and result == null`; saw 3 call(s): '
        'quote({"sku": "A"}) -> {"price": 10}, quote({"sku": "B"}) -> {"price": 20}, '
        'quote({"sku": "C"}) -> no recorded return'
    ]
    unchanged = judged(shop, "tests/shop.yaml", "the_hook_did_not_change_a")
    (reason,) = unchanged.invocations[0].failed_assertions
    assert 'quote({"sku": "A"}) -> {"price": 10}' in reason, reason


def test_result_and_invocations_cannot_share_a_conjunct() -> None:
    with pytest.raises(ExpressionError, match="not both"):
        compile_assertions({"expected_tool_calls": [{"quote": "result.count == invocations"}]})
    with pytest.raises(ExpressionError, match="not both"):
        compile_assertions({"expected_tool_calls": [{"quote": "(result or invocations) == 1"}]})


def test_mcp_results_expose_is_error_and_parts() -> None:
    # The gate runs no MCP server yet; a span that records one's call is read this way.
    span = {
        "span_id": "s2",
        "parent_span_id": "s1",
        "type": "tool_call",
        "name": "search_docs",
        "metadata": {
            "tool_name": "search_docs",
            "tool_ref": "search_docs",
            "mcp_server": "docs",
            "params": {"q": "x"},
            "result": {"isError": True, "content": [{"type": "text", "text": "down"}]},
        },
    }
    root = {"span_id": "s1", "parent_span_id": None, "type": "agent", "name": "a", "metadata": {}}
    calls = calls_in_scope([root, span], None)
    entry = {"search_docs": 'result.is_error and result.parts[0].text == "down"'}
    assert check_tool_calls(compile_assertions({"expected_tool_calls": [entry]}), calls, {}) == []


# -- issue 19, item 11: an error in the part of a filter that reads one call's values ------


def failures(entry: dict[str, str], calls: list[ToolCall], context: dict[str, object]) -> list[str]:
    return check_tool_calls(compile_assertions({"expected_tool_calls": [entry]}), calls, context)


def test_a_call_whose_params_make_a_filter_raise_only_fails_to_match() -> None:
    refunds = [
        ToolCall("refund", "pay.refund", {"amount": "lots", "to": None}),
        ToolCall("refund", "pay.refund", {"amount": 80, "to": {"email": "a@x"}}),
    ]
    # A type mismatch and a null nested value are the first call's own: the second matches.
    assert failures({"refund": "params.amount > 50 and invocations == 1"}, refunds, {}) == []
    assert failures({"refund": 'params.to.email == "a@x" and invocations == 1'}, refunds, {}) == []
    (alone,) = failures({"refund": "params.amount > 50"}, refunds[:1], {})
    assert alone == (
        "expected a call to refund with `params.amount > 50`; saw 1 call(s): "
        'refund({"amount": "lots", "to": null}); `params.amount > 50` could not be evaluated: '
        "cannot compare \"lots\" with 50: '>' not supported between instances of 'str' and "
        "'int'"
    ), alone


def test_an_error_outside_the_calls_values_still_fails_the_entry() -> None:
    calls = [ToolCall("refund", "pay.refund", {"amount": 80})]
    (failure,) = failures(
        {"refund": "context.limit > 5 and invocations == 0"}, calls, {"limit": "x"}
    )
    assert failure.startswith(
        "expected_tool_calls refund: `context.limit > 5` could not be evaluated: cannot compare"
    ), failure


def test_not_on_a_missing_key_is_never_true() -> None:
    # Decided: `not context.flag` on a missing key fails the expression (a missing key fails
    # the predicate), in expected_result as in a filter, where the call does not match.
    reason = check_result(
        compile_expression("not context.flag", ("output", "error", "status", "context")),
        status="completed",
        output=None,
        error=None,
        context={},
    )
    assert reason == "expected_result `not context.flag` could not be evaluated: no key flag in {}"
    calls = [ToolCall("send", "mail.send", {})]
    assert failures({"send": "not params.urgent and invocations == 0"}, calls, {}) == []

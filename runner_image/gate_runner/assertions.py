"""Assertions of one invocation (spec §6.3, §6.4): expected_result and the tool-call checks.

Everything here runs in the runner's parent process on plain data the invocation produced;
no user code runs while a verdict is formed.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .expr import (
    EvaluationError,
    Expression,
    ExpressionError,
    accessor_values,
    compile_expression,
    describe,
)

RESULT_NAMES = ("output", "error", "status", "context")
# `result` is the tool's return after its after hook (SDK test_schema.py module docstring).
TOOL_CALL_NAMES = ("params", "result", "invocations", "context")
# The bindings that are one call's own values: an error reading them is that call's.
PER_CALL_NAMES = frozenset({"params", "result"})
CHILD_PAYLOAD_NAMES = ("payload", "payload_raw", "context")


@dataclass(frozen=True)
class ToolCall:
    name: str  # bare function name
    ref: str  # qualified ref, e.g. math.calculator.add
    params: Mapping[str, Any]
    # False for a call the model made that the tool never received (aborted by a hook,
    # refused by an approval, hidden or unknown), with why in ``not_executed``.
    executed: bool = True
    not_executed: str | None = None
    # The tool's return after its after hook; ``returned`` is False for a call without a
    # recorded return (never executed, or it raised), which no `result` predicate matches.
    result: Any = None
    returned: bool = False


def _attempts(name: str, calls: Sequence[ToolCall]) -> str:
    """ "called N time(s), not executed (why)" for the calls to ``name`` the tool never got."""
    missed = [c for c in calls if not c.executed and _matches(name, c)]
    if not missed:
        return ""
    whys = sorted({c.not_executed or "not executed" for c in missed})
    return f"called {len(missed)} time(s), not executed ({' / '.join(whys)})"


@dataclass(frozen=True)
class ToolExpectation:
    tool: str
    filters: tuple[Expression, ...]
    counts: tuple[Expression, ...]
    source: str | None


@dataclass(frozen=True)
class CompiledAssertions:
    expected_result: Expression | None
    expected_tool_calls: tuple[ToolExpectation, ...]
    expected_tool_call_order: tuple[str, ...]
    expected_no_tool_calls: tuple[str, ...]
    expected_child_agents: tuple[ChildExpectation, ...] = ()


@dataclass(frozen=True)
class ChildExpectation:
    agent: str
    triggered: int
    payload: Expression | None
    checks: CompiledAssertions  # expected_result, tool calls and deeper children

    @property
    def needs_waited_trigger(self) -> bool:
        c = self.checks
        return bool(
            c.expected_result
            or c.expected_tool_calls
            or c.expected_tool_call_order
            or c.expected_no_tool_calls
            or c.expected_child_agents
        )


def _split_and(tree: ast.expr) -> list[ast.expr]:
    if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And):
        return list(tree.values)
    return [tree]


def compile_tool_expectation(entry: str | Mapping[str, str]) -> ToolExpectation:
    """Split a mapping entry's expression at top-level `and` into filters and count predicates."""
    if isinstance(entry, str):
        return ToolExpectation(tool=entry, filters=(), counts=(), source=None)
    ((tool, source),) = entry.items()
    whole = compile_expression(source, TOOL_CALL_NAMES)
    filters: list[Expression] = []
    counts: list[Expression] = []
    for part in _split_and(whole.tree):
        text = ast.unparse(part)
        sub = compile_expression(text, TOOL_CALL_NAMES)
        if "invocations" in sub.names and sub.names & PER_CALL_NAMES:
            raise ExpressionError(
                "a conjunct may use `params` and `result` (one call) or `invocations` (the "
                "count), not both",
                expression=source,
            )
        (counts if "invocations" in sub.names else filters).append(sub)
    return ToolExpectation(tool=tool, filters=tuple(filters), counts=tuple(counts), source=source)


def compile_assertions(case: Mapping[str, Any]) -> CompiledAssertions:
    """Compile every expression of a resolved case; raises ExpressionError on the first bad one."""
    result = case.get("expected_result")
    return CompiledAssertions(
        expected_result=compile_expression(result, RESULT_NAMES) if result else None,
        expected_tool_calls=tuple(
            compile_tool_expectation(e) for e in case.get("expected_tool_calls") or []
        ),
        expected_tool_call_order=tuple(case.get("expected_tool_call_order") or []),
        expected_no_tool_calls=tuple(case.get("expected_no_tool_calls") or []),
        expected_child_agents=compile_children(case.get("expected_child_agents")),
    )


def compile_children(spec: Mapping[str, Any] | None) -> tuple[ChildExpectation, ...]:
    out = []
    for agent, raw in (spec or {}).items():
        raw = raw or {}
        payload = raw.get("expected_payload")
        out.append(
            ChildExpectation(
                agent=agent,
                triggered=int(raw.get("expected_triggered") or 1),
                payload=compile_expression(payload, CHILD_PAYLOAD_NAMES) if payload else None,
                checks=compile_assertions(raw),
            )
        )
    return tuple(out)


def decode_output(output: Any) -> Any:
    """A string holding valid JSON is decoded; anything else stays as it is (spec §6.2)."""
    if isinstance(output, str):
        try:
            return json.loads(output)
        except ValueError:
            return output
    return output


def _matches(name: str, call: ToolCall) -> bool:
    """`add`, `calculator.add` and `math.calculator.add` all name math/calculator.py::add;
    `lookup`, `orders.lookup` and `mcp:orders.lookup` the MCP server orders' tool lookup
    (decided, issue 39)."""
    if name in (call.name, call.ref) or call.ref.endswith("." + name):
        return True
    return call.ref.startswith("mcp:") and name == call.ref.removeprefix("mcp:")


def _seen(expr: Expression, bindings: Mapping[str, Any]) -> str:
    values = accessor_values(expr, bindings)
    return "; ".join(f"{label} = {value}" for label, value in values) or "nothing"


def check_result(
    expr: Expression | None,
    *,
    status: str,
    output: Any,
    error: str | None,
    context: Mapping[str, Any],
) -> str | None:
    """expected_result with the short-circuit rule of spec §6.4; None when it holds."""
    bad_status = status != "completed"
    if expr is None:
        return _status_failure(status, error, output) if bad_status else None
    # An expression that reads `error` or `status` decides alone (spec §6.4).
    if bad_status and not ({"error", "status"} & expr.names):
        return _status_failure(status, error, output)
    bindings = {
        "output": decode_output(output),
        "error": error,
        "status": status,
        "context": context,
    }
    try:
        holds = expr.holds(bindings)
    except EvaluationError as exc:
        return f"expected_result `{expr.source}` could not be evaluated: {exc}"
    if holds:
        return None
    seen = _seen(expr, bindings)
    if status == "failed" and error and "error" not in expr.names:
        # `status == "completed"` against a crash: the crash itself is the key fact.
        seen += f"; agent error: {error}"
    return f"expected_result `{expr.source}` was false (seen: {seen})"


def _status_failure(status: str, error: str | None, output: Any = None) -> str:
    if status == "failed":
        return f"agent error: {error or 'the run failed without a message'}"
    why = f"the run ended with status {status!r}, expected 'completed'"
    if status == "blocked" and output:
        why += f" (a guardrail blocked it: {output})"
    elif status == "cancelled" and error:
        why += f" ({error})"  # what cancelled it: the agent's concurrency rule, say
    return why


class FilterError(Exception):
    """A tool-call filter failed for a reason that is not the call's (a typo in `context`)."""

    def __init__(self, source: str, error: EvaluationError) -> None:
        super().__init__(f"`{source}` could not be evaluated: {error}")


def _call_bindings(call: ToolCall, context: Mapping[str, Any]) -> dict[str, Any]:
    return {"params": call.params, "result": call.result, "context": context}


def _filter_passes(exp: ToolExpectation, call: ToolCall, context: Mapping[str, Any]) -> bool:
    """Whether ``call`` passes every filter of ``exp``.

    A call without a recorded return matches no `result` predicate (SDK test_schema.py:
    "calls without a recorded return do not match result predicates"). An error in the part
    of a filter that reads the call's own `params` or `result` (a key this call lacks, a null
    nested value, a value of another type) means this call does not match (seed: "a missing
    key fails the predicate"), while another call may; any other error (a key missing from
    `context`) would fail every call alike and is raised, so that `invocations == 0` cannot
    pass on an expression that never worked (decided, issue 19 item 11).
    """
    for f in exp.filters:
        if "result" in f.names and not call.returned:
            return False
        try:
            if not f.holds(_call_bindings(call, context)):
                return False
        except EvaluationError as exc:
            if exc.names & PER_CALL_NAMES:
                return False
            raise FilterError(f.source, exc) from None
    return True


def _seen_call(call: ToolCall, with_result: bool) -> str:
    seen = f"{call.name}({describe(dict(call.params))})"
    if not with_result:
        return seen
    return seen + (f" -> {describe(call.result)}" if call.returned else " -> no recorded return")


def _unmatched_reason(
    exp: ToolExpectation, same_tool: Sequence[ToolCall], context: Mapping[str, Any]
) -> str:
    """Say what was expected and what the calls to that tool actually carried."""
    what = f"expected a call to {exp.tool}" + (f" with `{exp.source}`" if exp.source else "")
    if not same_tool:
        return f"{what}; it was never called"
    with_result = any("result" in f.names for f in exp.filters)
    seen = ", ".join(_seen_call(c, with_result) for c in same_tool[:3])
    more = f" and {len(same_tool) - 3} more" if len(same_tool) > 3 else ""
    errors = []
    for f in exp.filters:
        for call in same_tool:
            if "result" in f.names and not call.returned:
                continue
            try:
                f.evaluate(_call_bindings(call, context))
            except EvaluationError as exc:
                errors.append(f"`{f.source}` could not be evaluated: {exc}")
                break
    passing = sum(1 for c in same_tool if _filter_passes(exp, c, context))
    if passing:
        return (
            f"{what}; the {passing} call(s) that fit it were all claimed by other entries "
            f"of expected_tool_calls (each entry needs a call of its own): {seen}{more}"
        )
    tail = f"; {errors[0]}" if errors else ""
    return f"{what}; saw {len(same_tool)} call(s): {seen}{more}{tail}"


def check_tool_calls(
    assertions: CompiledAssertions,
    calls: Sequence[ToolCall],
    context: Mapping[str, Any],
) -> list[str]:
    """expected_tool_calls, expected_tool_call_order and expected_no_tool_calls.

    Every call the model made is in the list, executed or not (issue 19, item 6; SDK
    test_schema.py: "calls without a recorded return do not match result predicates", so
    such calls are in the list): an aborted, refused or hidden call counts for
    `invocations`, bare entries and the order as it does for expected_no_tool_calls, and
    filters see the params the model sent. Reasons say when a call was not executed.
    """
    attempted = calls = list(calls)
    failures: list[str] = []
    # Which calls each entry may claim; an entry with only count predicates claims none,
    # because it speaks of how many calls there were, not of one of them.
    candidates: list[list[int]] = []
    broken: set[int] = set()
    for index, exp in enumerate(assertions.expected_tool_calls):
        try:
            eligible = [
                i
                for i, c in enumerate(calls)
                if _matches(exp.tool, c) and _filter_passes(exp, c, context)
            ]
        except FilterError as exc:
            failures.append(f"expected_tool_calls {exp.tool}: {exc}")
            broken.add(index)
            candidates.append([])
            continue
        if exp.counts:
            bindings = {"invocations": len(eligible), "context": context}
            for pred in exp.counts:
                try:
                    ok = pred.holds(bindings)
                except EvaluationError as exc:
                    failures.append(f"expected_tool_calls {exp.tool}: `{pred.source}`: {exc}")
                    continue
                if not ok:
                    missed = _attempts(exp.tool, [calls[i] for i in eligible])
                    failures.append(
                        f"expected_tool_calls {exp.tool}: `{exp.source}` was false "
                        f"(invocations = {len(eligible)}"
                        + (f"; counted calls include ones {missed}" if missed else "")
                        + ")"
                    )
            candidates.append([])
        else:
            candidates.append(eligible)
    needing = [
        i
        for i, exp in enumerate(assertions.expected_tool_calls)
        if not exp.counts and i not in broken
    ]
    unmatched = _unmatched_entries(needing, candidates)
    for i in unmatched:
        exp = assertions.expected_tool_calls[i]
        reason = _unmatched_reason(exp, [c for c in calls if _matches(exp.tool, c)], context)
        missed = _attempts(exp.tool, attempted)
        failures.append(f"{reason}; it was {missed}" if missed else reason)
    order = list(assertions.expected_tool_call_order)
    if order:
        pos = 0
        for call in calls:
            if pos < len(order) and _matches(order[pos], call):
                pos += 1
        if pos < len(order):
            seen = (
                ", ".join(c.ref + ("" if c.executed else " (not executed)") for c in calls)
                or "no calls"
            )
            missed = _attempts(order[pos], attempted)
            failures.append(
                f"expected_tool_call_order {order} not met: {order[pos]} missing after "
                f"{order[:pos] or 'the start'} (calls: {seen})"
                + (f"; {order[pos]} was {missed}" if missed else "")
            )
    for name in assertions.expected_no_tool_calls:
        hits = [c for c in attempted if _matches(name, c)]
        if hits:
            executed = sum(1 for c in hits if c.executed)
            missed = _attempts(name, attempted)
            failures.append(
                f"expected no call to {name}, saw {len(hits)}"
                + (f" ({executed} executed; {missed})" if missed else "")
            )
    return failures


def _unmatched_entries(entries: list[int], candidates: list[list[int]]) -> list[int]:
    """Maximum bipartite matching of entries to distinct calls (Kuhn's augmenting paths).

    Returns the entries left without a call; repeated entries for one tool need distinct calls.
    """
    owner: dict[int, int] = {}

    def augment(entry: int, visited: set[int]) -> bool:
        for call in candidates[entry]:
            if call in visited:
                continue
            visited.add(call)
            if call not in owner or augment(owner[call], visited):
                owner[call] = entry
                return True
        return False

    return [e for e in entries if not augment(e, set())]


# -- expected_child_agents (spec 6.5) ------------------------------------------------------


def trigger_scope(span: Mapping[str, Any], by_id: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The child_agent span a span belongs under (None: the agent under test itself)."""
    parent = span.get("parent_span_id")
    while parent is not None:
        above = by_id.get(parent)
        if above is None:
            return None
        if above.get("type") == "child_agent":
            return str(above["span_id"])
        parent = above.get("parent_span_id")
    return None


def mcp_result(raw: Any) -> dict[str, Any]:
    """An MCP tool's result as assertions see it: `is_error` and `parts` (SDK test_schema.py:
    "MCP results expose is_error and parts"), from either spelling of a CallToolResult."""
    if not isinstance(raw, Mapping):
        return {"is_error": False, "parts": [raw]}
    parts = raw.get("parts", raw.get("content", []))
    return {
        "is_error": bool(raw.get("is_error", raw.get("isError", False))),
        "parts": list(parts) if isinstance(parts, list | tuple) else [parts],
    }


def tool_call_of(span: Mapping[str, Any]) -> ToolCall:
    """The call a tool_call span records, as every tool assertion sees it.

    A call through `use_tool` that resolved to a discoverable tool (``discovered`` in the
    span) is that tool's call, under its own name and ref, with its parameters (SDK
    test_schema.py: "Discoverable calls use the actual tool name or canonical ref in every
    tool assertion, with that tool's parameters and result").
    """
    meta = span["metadata"]
    found = meta.get("discovered")
    source = found if isinstance(found, Mapping) else meta
    name = str(source.get("tool_name", span["name"]))
    executed = bool(meta.get("executed", True))
    returned = executed and "result" in meta
    result = meta.get("result")
    if returned and meta.get("mcp_server"):
        result = mcp_result(result)
    return ToolCall(
        name=name,
        ref=str(source.get("tool_ref", name)),
        params=source.get("params") or {},
        executed=executed,
        not_executed=meta.get("not_executed"),
        result=result,
        returned=returned,
    )


def calls_in_scope(spans: Sequence[Mapping[str, Any]], scope: str | None) -> list[ToolCall]:
    """The tool calls a run made itself (attempted ones too), not its children's."""
    by_id = {str(s["span_id"]): s for s in spans}
    return [
        tool_call_of(s)
        for s in spans
        if s.get("type") == "tool_call" and trigger_scope(s, by_id) == scope
    ]


def _payload_bindings(record: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    sent = record["metadata"].get("payload")
    return {
        "payload": decode_output(sent),
        "payload_raw": sent if isinstance(sent, str) else "",
        "context": context,
    }


def check_children(
    expectations: Sequence[ChildExpectation],
    spans: Sequence[Mapping[str, Any]],
    context: Mapping[str, Any],
    scope: str | None = None,
    path: str = "",
) -> list[str]:
    """Every expected_child_agents entry below ``scope``, to any depth."""
    by_id = {str(s["span_id"]): s for s in spans}
    records = [
        s for s in spans if s.get("type") == "child_agent" and trigger_scope(s, by_id) == scope
    ]
    failures: list[str] = []
    for exp in expectations:
        label = f"expected_child_agents {path}{exp.agent}"
        mine = [r for r in records if r["name"] == exp.agent]
        if len(mine) < exp.triggered:
            failures.append(
                f"{label}: expected at least {exp.triggered} trigger(s), saw {len(mine)}"
            )
            continue
        if not exp.needs_waited_trigger:
            if exp.payload is not None:
                failures.extend(_check_payload(label, exp.payload, mine, context))
            continue
        waited = [
            r
            for r in mine
            if r["metadata"].get("wait_for_response") and not r["metadata"].get("scheduled")
        ]
        if not waited:
            failures.append(
                f"{label}: its expected_result, tool-call or child assertions need a waited "
                f"trigger, and all {len(mine)} trigger(s) were fire-and-forget; trigger it "
                "with wait_for_response=True"
            )
            continue
        # One waited trigger must satisfy the whole entry, its payload included (spec 6.5,
        # seed: "at least one must pass"): checks split over two triggers prove nothing.
        attempts = [
            _payload_problems(exp.payload, r, context)
            + _check_waited(exp, r, spans, context, f"{path}{exp.agent}.")
            for r in waited
        ]
        if all(attempts):
            closest = min(range(len(attempts)), key=lambda i: len(attempts[i]))
            failures.append(
                f"{label}: none of {len(waited)} waited trigger(s) met the whole entry; the "
                f"closest (trigger {closest + 1} of {len(waited)}): " + "; ".join(attempts[closest])
            )
    return failures


def _check_payload(
    label: str, expr: Expression, records: Sequence[Mapping[str, Any]], context: Mapping[str, Any]
) -> list[str]:
    errors = []
    for record in records:
        bindings = _payload_bindings(record, context)
        try:
            if expr.holds(bindings):
                return []  # decided (spec 13.12): any trigger's payload may satisfy it
        except EvaluationError as exc:
            errors.append(str(exc))
    seen = "; ".join(_seen(expr, _payload_bindings(r, context)) for r in records[:3])
    detail = f"; {errors[0]}" if errors else ""
    return [f"{label}: no trigger's payload satisfied `{expr.source}` (seen: {seen}){detail}"]


def _payload_problems(
    expr: Expression | None, record: Mapping[str, Any], context: Mapping[str, Any]
) -> list[str]:
    """What keeps one trigger's payload from satisfying ``expr`` (nothing when it does)."""
    if expr is None:
        return []
    bindings = _payload_bindings(record, context)
    try:
        if expr.holds(bindings):
            return []
    except EvaluationError as exc:
        return [f"expected_payload `{expr.source}` could not be evaluated: {exc}"]
    return [f"expected_payload `{expr.source}` was false (seen: {_seen(expr, bindings)})"]


def _check_waited(
    exp: ChildExpectation,
    record: Mapping[str, Any],
    spans: Sequence[Mapping[str, Any]],
    context: Mapping[str, Any],
    path: str,
) -> list[str]:
    meta = record["metadata"]
    status = str(meta.get("status") or ("failed" if meta.get("error") else "completed"))
    failures = []
    result = check_result(
        exp.checks.expected_result,
        status=status,
        output=meta.get("output"),
        error=meta.get("error"),
        context=context,
    )
    if result:
        failures.append(result)
    scope = str(record["span_id"])
    failures.extend(check_tool_calls(exp.checks, calls_in_scope(spans, scope), context))
    failures.extend(check_children(exp.checks.expected_child_agents, spans, context, scope, path))
    return failures

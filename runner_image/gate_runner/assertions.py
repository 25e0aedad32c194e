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
TOOL_CALL_NAMES = ("params", "invocations", "context")
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
        if "invocations" in sub.names and "params" in sub.names:
            raise ExpressionError(
                "a conjunct may use `params` or `invocations`, not both", expression=source
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
    """`add`, `calculator.add` and `math.calculator.add` all name math/calculator.py::add."""
    return name in (call.name, call.ref) or call.ref.endswith("." + name)


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
    return why


class FilterError(Exception):
    """A tool-call filter failed for a reason that is not the call's (a typo in `context`)."""

    def __init__(self, source: str, error: EvaluationError) -> None:
        super().__init__(f"`{source}` could not be evaluated: {error}")


def _within(value: Any, target: Any) -> bool:
    """Whether ``target`` is ``value`` or lies inside it (by identity)."""
    if value is target:
        return True
    if isinstance(value, Mapping):
        return any(_within(v, target) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_within(v, target) for v in value)
    return False


def _filter_passes(exp: ToolExpectation, call: ToolCall, context: Mapping[str, Any]) -> bool:
    """Whether ``call`` passes every filter of ``exp``.

    A lookup that fails inside the call's `params` (a key this call lacks) means this call
    does not match (seed: "a missing key fails the predicate"); any other error (a key
    missing from `context`, a type error) would fail every call alike and is raised, so that
    `invocations == 0` cannot pass on an expression that never worked.
    """
    for f in exp.filters:
        try:
            if not f.holds({"params": call.params, "context": context}):
                return False
        except EvaluationError as exc:
            if exc.container is not None and _within(call.params, exc.container):
                return False
            raise FilterError(f.source, exc) from None
    return True


def _unmatched_reason(
    exp: ToolExpectation, same_tool: Sequence[ToolCall], context: Mapping[str, Any]
) -> str:
    """Say what was expected and what the calls to that tool actually carried."""
    what = f"expected a call to {exp.tool}" + (f" with `{exp.source}`" if exp.source else "")
    if not same_tool:
        return f"{what}; it was never called"
    seen = ", ".join(f"{c.name}({describe(dict(c.params))})" for c in same_tool[:3])
    more = f" and {len(same_tool) - 3} more" if len(same_tool) > 3 else ""
    errors = []
    for f in exp.filters:
        for call in same_tool:
            try:
                f.evaluate({"params": call.params, "context": context})
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

    Decided (issue 10, rule 4): a call the tool never received still occurred for
    expected_no_tool_calls (the model tried, spec 6.3); expected_tool_calls and the order
    speak of calls the tool received, and say so when a call was only attempted.
    """
    attempted = list(calls)
    calls = [c for c in attempted if c.executed]
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
                    failures.append(
                        f"expected_tool_calls {exp.tool}: `{exp.source}` was false "
                        f"(invocations = {len(eligible)})"
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
            seen = ", ".join(c.ref for c in calls) or "no calls"
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


def calls_in_scope(spans: Sequence[Mapping[str, Any]], scope: str | None) -> list[ToolCall]:
    """The tool calls a run made itself (attempted ones too), not its children's."""
    by_id = {str(s["span_id"]): s for s in spans}
    return [
        ToolCall(
            name=str(s["metadata"].get("tool_name", s["name"])),
            ref=str(s["metadata"].get("tool_ref", s["name"])),
            params=s["metadata"].get("params") or {},
            executed=bool(s["metadata"].get("executed", True)),
            not_executed=s["metadata"].get("not_executed"),
        )
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

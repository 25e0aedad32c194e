"""What the results pages show, shaped from the API's views: pure functions, no I/O.

Everything here comes from a bundle's run (names, outputs, span metadata), so it is hostile
text: the templates escape it (autoescape), and the trace tree is built without recursion and
to a bounded depth, since a bundle's code can nest or loop its spans as it likes.
"""

from __future__ import annotations

import json
import re
import string
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gate_runner.contract import Span

from ..baselines.figures import case_figures
from ..baselines.schemas import CaseGateRead
from ..client import notes, words
from ..client.causes import CAUSES, Cause, case_cause, failure_groups
from ..client.model_requests import MessageText, count, message_text, request_summary
from ..client.notes import Note
from ..client.shapes import CaseView
from ..gates.schemas import CaseRead, GateRead
from ..models import Case

# Deeper spans are listed flat under the span at this depth: a page stays renderable (and
# Jinja's recursion bounded) whatever nesting a bundle's code produced.
MAX_TRACE_DEPTH = 40

TERMINAL = frozenset({"passed", "failed", "error", "cancelled"})


duration = words.duration
money = words.money
span_word = words.span_word

# Label values a heading shows whole up to this many characters.
HEADING_LABEL_CHARS = 40


def cut(text: Any, limit: int) -> str:
    return words.cut(None if text is None else str(text), limit)


def size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return f"{n:,} bytes"


def shown(value: Any) -> str:
    """A value as the pages print it: text as it is, anything else as indented JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def css_word(value: Any) -> str:
    """A bundle's word (a span's type, say) as one CSS class name: escaping keeps it from
    breaking out of the attribute, this keeps it from naming other classes (hidden, pass)."""
    return re.sub(r"[^a-z0-9_-]", "_", str(value).lower())[:40] or "_"


def is_short(value: Any) -> bool:
    """A value shown inline (a name, a number, a flag) rather than as a block."""
    if isinstance(value, bool | int | float) or value is None:
        return True
    return isinstance(value, str) and len(value) <= 100 and "\n" not in value


def _view(case: CaseRead) -> CaseView:
    view: CaseView = CaseView.of(case.model_dump(mode="json"))
    return view


@dataclass(frozen=True)
class ResultView:
    """A case's Result cell: its outcome's word (the terminal's and JUnit's), the badge's
    class, and the marks that qualify it (REUSED, QUARANTINED, REGRESSED, FLAKY)."""

    word: str
    css: str
    marks: list[str]


def result_view(case: CaseRead) -> ResultView:
    view = _view(case)
    outcome = words.case_outcome(view)
    return ResultView(outcome.word, f"o-{outcome.value}", words.case_marks(view))


def result_word(case: CaseRead) -> str:
    """Pass and fail in words, not colour alone."""
    return result_view(case).word


def span_outcome_css(status: Any) -> str:
    """A step's badge class: its outcome's, so a skipped guardrail never wears a pass's."""
    return f"o-{words.span_outcome(status).value}"


def short_commit(commit: str) -> str:
    """A commit as people quote it: a hash's first 10 hex digits (the whole one is in the
    facts); any other label value as it is, cut at HEADING_LABEL_CHARS."""
    if len(commit) >= 12 and all(ch in string.hexdigits for ch in commit):
        return commit[:10]
    return cut(commit, HEADING_LABEL_CHARS)


def gate_title(gate: GateRead) -> str:
    """What a person calls a gate: its commit and branch labels when it has them, else the
    start of its id."""
    commit, branch = gate.labels.get("commit"), gate.labels.get("branch")
    parts = []
    if commit not in (None, ""):
        parts.append(f"Commit {short_commit(str(commit))}")
    if branch not in (None, ""):
        parts.append(("on " if parts else "Branch ") + cut(branch, HEADING_LABEL_CHARS))
    return " ".join(parts) if parts else f"Gate {str(gate.id)[:8]}"


@dataclass(frozen=True)
class CauseGroup:
    """A failure group on the gate page: its cause, heading, whose fault, and its cases."""

    cause: Cause
    line: str
    agents: bool
    cases: list[CaseRead]


def cause_groups(cases: Sequence[CaseRead]) -> list[CauseGroup]:
    """``causes.failure_groups`` of the page's cases (the same groups `gate submit` prints)."""
    shown = [_view(case) for case in cases]
    read = {id(view): case for view, case in zip(shown, cases, strict=True)}
    return [
        CauseGroup(g.cause, g.line, g.info.agents, [read[id(c)] for c in g.cases])
        for g in failure_groups(shown)
    ]


def cause_title(case: CaseRead) -> str | None:
    cause = case_cause(_view(case))
    return None if cause is None else CAUSES[cause].title


def case_notes(case: CaseRead) -> list[Note]:
    """What a case's row cannot say (its comparison with the baseline, quarantine, flakiness,
    a narrow interval, an early stop, a reuse), in the words `gate submit` prints."""
    return notes.case_notes(_view(case))


def row_view(case: Case) -> CaseView:
    """A case row (the case page reads its row) as the client's view, with its figures."""
    answer = {
        "status": case.status,
        "passed": case.passed,
        "successes": case.successes,
        "runs": case.runs,
        "success_threshold": case.success_threshold,
        "failure_reason": case.failure_reason,
        "stopped_early": case.stopped_early,
        "invocations_run": case.invocations_run,
        "baseline": case.baseline,
        "regression_level": case.regression_level,
        "flaky": case.flaky,
        "quarantine": case.quarantine,
        "reused_from": str(case.reused_from) if case.reused_from else None,
    } | case_figures(case).answered()
    view: CaseView = CaseView.of(answer)
    return view


def row_notes(case: Case) -> list[Note]:
    """``case_notes`` of a case row."""
    return notes.case_notes(row_view(case))


def row_result(case: Case) -> tuple[ResultView, str | None]:
    """A case row's Result: its outcome and marks, and the title of its failure's cause."""
    view = row_view(case)
    outcome = words.case_outcome(view)
    cause = case_cause(view)
    result = ResultView(outcome.word, f"o-{outcome.value}", words.case_marks(view))
    return result, None if cause is None else CAUSES[cause].title


@dataclass(frozen=True)
class BaselineCell:
    """A case's baseline as the gate page's column shows it."""

    rate: str  # "9 / 10 (90%)", or "new", "not comparable"
    level: str | None  # "REGRESSION", "LIKELY": its badge
    p_value: str | None
    case_id: str | None  # the baseline's case, for its link


def baseline_cell(case: CaseRead) -> BaselineCell | None:
    """None when the case was not compared (no baseline)."""
    base = case.baseline
    if base is None:
        return None
    if case.reused_from is not None:
        return BaselineCell("reused", None, None, str(case.reused_from))
    if not base.comparable:
        word = "new" if base.case_id is None else "not comparable"
        return BaselineCell(word, None, None, str(base.case_id) if base.case_id else None)
    level = {"regression": "REGRESSION", "likely": "LIKELY"}.get(case.regression_level or "")
    shown_rate = notes.rate(base.successes, base.runs).replace("/", " / ", 1)
    return BaselineCell(shown_rate, level, notes.p_text(base.p_value), str(base.case_id))


def interval_text(case: CaseRead) -> str | None:
    interval = case.interval
    return None if interval is None else notes.interval_text(interval.low, interval.high)


# The gate page's order of cases by outcome: what fails the gate first (a regression too),
# then what could not be judged, then what was skipped (a quarantined failure, a reuse).
_RANK = {words.Outcome.failed: 0, words.Outcome.error: 1, words.Outcome.skipped: 2}


def ordered_cases(cases: Sequence[CaseRead]) -> list[CaseRead]:
    """Failed cases first, then errors, then skipped ones, then the rest; the suite's order
    within each (sorted is stable)."""
    return sorted(cases, key=lambda case: _RANK.get(words.case_outcome(_view(case)), 3))


def verdict_counts(cases: Sequence[CaseRead]) -> tuple[int, int]:
    """How many cases passed (``words.counts_as_passed``: a regressed one did not, a reused
    one did) and how many of those were reused: the verdict line's figures, as the terminal
    counts them."""
    shown = [_view(case) for case in cases]
    passed = sum(1 for view in shown if words.counts_as_passed(view))
    return passed, sum(1 for view in shown if view.reused_from)


def progress(gate: GateRead) -> str | None:
    """The line a running gate shows (None once it has ended)."""
    if gate.status in TERMINAL:
        return None
    if gate.status == "queued":
        return "Queued: waiting for a worker."
    done = sum(1 for c in gate.cases if c.status not in ("queued", "running"))
    running = sum(1 for c in gate.cases if c.status == "running")
    if not gate.cases:
        return f"Running: {gate.phase.replace('_', ' ')}."
    line = f"Running: {done} of {len(gate.cases)} cases finished"
    if running:
        line += f", {running} running"
    return line + f" ({gate.phase.replace('_', ' ')})."


def gate_duration(gate: GateRead) -> int | None:
    if gate.started_at is None or gate.finished_at is None:
        return None
    return int((gate.finished_at - gate.started_at).total_seconds() * 1000)


@dataclass(frozen=True)
class ToolView:
    name: str
    description: str | None
    schema: Any  # its parameters' JSON schema; None when the request kept names only


@dataclass(frozen=True)
class RequestView:
    """A model span's request (issue 38) as the run page shows it, under the span."""

    summary: str
    system_prompt: str | None
    messages: list[MessageText]
    messages_dropped: int
    tools: list[ToolView]
    tool_schemas_dropped: bool
    response_format: Any
    omitted: str | None


def request_view(span: Span) -> RequestView | None:
    """The request a model span recorded, or None when it holds none in the runner's shape
    (its metadata then shows as every other span's)."""
    request = span.metadata.get("request")
    if span.type != "model_call" or not isinstance(request, dict):
        return None
    system = request.get("system_prompt")
    messages = request.get("messages")
    offered = request.get("tools")
    tools = []
    for tool in offered if isinstance(offered, list) else []:
        if not isinstance(tool, dict):
            tools.append(ToolView(shown(tool), None, None))
            continue
        description = tool.get("description")
        tools.append(
            ToolView(
                name=shown(tool.get("name")),
                description=shown(description) if description else None,
                schema=tool.get("parameters"),
            )
        )
    omitted = request.get("omitted")
    return RequestView(
        summary=request_summary(request),
        system_prompt=None if system is None else shown(system),
        messages=[message_text(m) for m in messages] if isinstance(messages, list) else [],
        messages_dropped=count(request.get("messages_dropped")),
        tools=tools,
        tool_schemas_dropped=bool(count(request.get("tool_schemas_dropped"))),
        response_format=request.get("response_format"),
        omitted=None if omitted is None else shown(omitted),
    )


@dataclass
class TraceNode:
    span: Span
    children: list[TraceNode] = field(default_factory=list)
    flattened: bool = False  # its descendants past MAX_TRACE_DEPTH are listed flat here

    @cached_property
    def request(self) -> RequestView | None:
        return request_view(self.span)

    @property
    def mocked(self) -> bool:
        return self.span.metadata.get("mocked") is True

    @property
    def facts(self) -> list[str]:
        """The summary line's short facts: model, tokens, cost, mocked, fallback."""
        meta = self.span.metadata
        out: list[str] = []
        if self.span.type == "model_call":
            if meta.get("mode"):
                out.append(str(meta["mode"]))
            if "tokens_in" in meta or "tokens_out" in meta:
                out.append(
                    f"tokens {meta.get('tokens_in', 0)} in / {meta.get('tokens_out', 0)} out"
                )
            cost = meta.get("cost_usd")
            if isinstance(cost, int | float) and not isinstance(cost, bool):
                out.append(money(cost))
            if meta.get("fallback") is True:
                out.append("fallback model")
        if self.mocked:
            out.append("mocked")
        return out


def trace_tree(spans: Iterable[Span]) -> list[TraceNode]:
    """The spans as a forest: each under its parent, in span order. A span whose parent is
    missing, itself, or part of a cycle is shown at the top rather than lost."""
    # Nodes by position, not by id: a bundle may give two spans one id, and neither may hide
    # the other. A parent id names the first span that has it.
    nodes = [TraceNode(s) for s in sorted(spans, key=lambda s: s.span_order)]
    first: dict[str, int] = {}
    for at, node in enumerate(nodes):
        first.setdefault(node.span.span_id, at)
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for at, node in enumerate(nodes):
        parent = first.get(node.span.parent_span_id or "")
        if node.span.parent_span_id is None or parent is None or parent == at:
            roots.append(at)
        else:
            children.setdefault(parent, []).append(at)
    placed: set[int] = set()

    def attach(top: int) -> None:
        # Iterative depth-first walk of (node, depth); each node is placed once.
        stack = [(top, 0)]
        placed.add(top)
        while stack:
            at, depth = stack.pop()
            below = [c for c in children.get(at, []) if c not in placed]
            placed.update(below)
            if depth + 1 >= MAX_TRACE_DEPTH:
                # The rest of this subtree, flat, in the order a walk meets it.
                flat: list[TraceNode] = []
                queue = deque(below)
                while queue:
                    child = queue.popleft()
                    flat.append(nodes[child])
                    more = [c for c in children.get(child, []) if c not in placed]
                    placed.update(more)
                    queue.extend(more)
                nodes[at].children, nodes[at].flattened = flat, bool(flat)
                continue
            nodes[at].children = [nodes[c] for c in below]
            stack.extend((child, depth + 1) for child in reversed(below))

    for root in roots:
        attach(root)
    # Spans only reachable through a cycle: each cycle shown from its first span.
    for at in range(len(nodes)):
        if at not in placed:
            roots.append(at)
            attach(at)
    return [nodes[at] for at in roots]


@dataclass(frozen=True)
class HistoryRow:
    """One gate of a case's history on its page: the row, and whether the case's closure
    hash changed since the row before it (the case's code or inputs changed there)."""

    row: CaseGateRead
    closure_changed: bool


def history_rows(rows: Sequence[CaseGateRead]) -> list[HistoryRow]:
    """A case's history, oldest first, marked where its closure hash changed."""
    marked = []
    previous: str | None = None
    for index, row in enumerate(rows):
        changed = index > 0 and row.closure_hash != previous
        marked.append(HistoryRow(row, changed))
        previous = row.closure_hash
    return marked

"""What `gate submit` shows: progress while waiting, then results as the format's CLI shows them.

Rich draws the table and the progress bar and decides whether the output is a terminal
(colours and a live bar) or not (plain text, one progress line per change). Everything a
bundle controls (names, inputs, outputs, errors, span labels) is passed as plain Text with its
control characters made visible, so it can neither carry markup nor terminal escapes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from .causes import failure_groups, first_check
from .junit import warning_line
from .model_requests import format_kind, message_text, request_summary
from .notes import Tone, case_notes
from .shapes import CaseView, FailedRuns, GateView, ModelCalls, ShownRun, TraceSpan
from .words import (
    MARKS,
    WENT_WRONG,
    Outcome,
    case_marks,
    case_outcome,
    counts_as_passed,
    cut,
    duration,
    money,
    span_outcome,
)

TRUNCATE_AT = 800
SPAN_ERROR_AT = 160
SHOWN_RUNS = 3
# Gate warnings printed before "… and N more" (all of them with --verbose).
SHOWN_WARNINGS = 3
# Cases listed under a failure group before "… and N more".
SHOWN_GROUP_CASES = 5

# The format CLI's labels for the backend's phases; unknown phases are shown as they are.
PHASE_LABELS = {
    "queued": "Queued: waiting for a worker",
    "validating": "Validating uploaded files...",
    "building": "Building tests...",
    "starting_container": "Starting test runner container...",
    "running_tests": "Running test cases...",
    "done": "Test runner finished.",
    "error": "The gate reported an error.",
}
JUDGED = frozenset({"passed", "failed", "error", "cancelled"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def visible(value: object) -> str:
    """Text with C0, DEL and C1 controls written out (``\\x1b``), as the format CLI does."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def as_text(value: object) -> str:
    """A run field as text: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def truncate(text: str | None, limit: int = TRUNCATE_AT) -> str:
    """``words.cut``: a cut text ends with "…" and how much was cut."""
    return cut(text, limit)


def case_label(case: CaseView) -> str:
    return f"{case.agent_name}::{case.test_name}"


def judged_count(gate: GateView) -> int:
    if gate.judged_cases is not None:  # the whole gate's, whatever page it holds
        return int(gate.judged_cases)
    return sum(1 for case in gate.cases if case.status in JUDGED)


def phase_label(phase: str | None) -> str:
    return PHASE_LABELS.get(phase or "queued", phase or "queued")


# -- progress ------------------------------------------------------------------------------


class GateProgress:
    """Follows a gate while it runs: a live bar on a terminal, plain lines otherwise, or
    nothing at all (``quiet``, for --json)."""

    def __init__(self, console: Console, *, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self._last_line: str | None = None
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    @contextmanager
    def running(self) -> Iterator[GateProgress]:
        if not self.quiet and self.console.is_terminal:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("cases judged"),
                TimeElapsedColumn(),
                console=self.console,
            )
            with self._bar:
                self._task = self._bar.add_task("Queued...", total=None)
                yield self
            self._bar = None
        else:
            yield self

    def update(self, answer: GateView | Mapping[str, Any]) -> None:
        if self.quiet:
            return
        gate = GateView.of(answer)
        total = gate.total_cases or 0
        judged = judged_count(gate)
        if self._bar is not None and self._task is not None:
            self._bar.update(
                self._task,
                description=visible(phase_label(gate.phase)),
                completed=judged,
                total=total or None,
            )
            return
        # Off a terminal (a CI log): a line for each change, in words, never twice.
        line = progress_line(gate)
        if line == self._last_line:
            return
        self._last_line = line
        self.console.print(Text(visible(line)), soft_wrap=True)


def progress_line(gate: GateView) -> str:
    """Where a gate stands, as a plain log says it: ``Queued: waiting for a worker``,
    ``Running test cases... 3 of 20 cases judged``."""
    status = gate.status or "queued"
    if status == "queued":
        return "Queued: waiting for a worker"
    if status in JUDGED:
        return f"Finished: {status}"
    line = phase_label(gate.phase)
    total = gate.total_cases or 0
    if total:
        line += f" {judged_count(gate)} of {total} cases judged"
    return line


# -- results -------------------------------------------------------------------------------


# A case's outcome in the terminal: its word (the page's and JUnit's), coloured.
RESULT_STYLES = {
    Outcome.passed: "bold green",
    Outcome.failed: "bold red",
    Outcome.error: "bold red",
    Outcome.skipped: "yellow",
    Outcome.pending: "dim",
}


def _result_cell(case: CaseView) -> Text:
    outcome = case_outcome(case)
    style = RESULT_STYLES.get(outcome, "")
    if case.quarantine and outcome is Outcome.skipped and case.passed is not True:
        style = "bold yellow"  # a quarantined failure: reported, and not red
    cell = Text(f" {outcome.word} ", style=style)
    marks = case_marks(case)
    if marks:
        cell.append(" " + " ".join(marks), style="dim")
    return cell


def _runs_cell(case: CaseView) -> Text:
    done = case.runs_done()
    text = f"{case.successes or 0}/{done}"
    if case.stopped_early and case.runs and done < case.runs:
        text += f" of {case.runs}"
    return Text(text)


def _baseline_cell(case: CaseView) -> Text:
    base = case.baseline
    if base is None:
        return Text("")
    if case.reused_from:
        return Text("reused", style="dim")
    if base.comparable is not True:
        return Text("new" if base.case_id is None else "not comparable", style="dim")
    counts = f"{base.successes}/{base.runs}"
    if case.regression_level == "regression":
        return Text(f"{counts} regression", style="yellow" if case.quarantine else "bold red")
    if case.regression_level == "likely":
        return Text(f"{counts} likely regression", style="yellow")
    return Text(counts)


def results_table(cases: list[CaseView]) -> Table:
    table = Table(box=box.SQUARE, show_lines=False)
    table.add_column("Result", no_wrap=True)
    table.add_column("Test", overflow="fold")
    table.add_column("Runs", no_wrap=True, justify="right")
    table.add_column("Threshold", no_wrap=True, justify="right")
    # Only when the gate was compared with a baseline: an older service's table is unchanged.
    with_baseline = any(case.baseline is not None for case in cases)
    if with_baseline:
        table.add_column("Baseline", no_wrap=True)
    for case in cases:
        cells = [
            _result_cell(case),
            Text(visible(case_label(case))),
            _runs_cell(case),
            Text(f"{case.success_threshold or 0}%"),
        ]
        if with_baseline:
            cells.append(_baseline_cell(case))
        table.add_row(*cells)
    return table


# How loud each tone of a note is on a terminal.
TONE_STYLES = {Tone.fail: "red", Tone.warn: "yellow", Tone.quiet: "dim", Tone.plain: ""}


def note_lines(case: CaseView) -> list[Text]:
    """The case's notes (``notes.case_notes``) as terminal lines, controls made visible."""
    return [Text(visible(note.text), style=TONE_STYLES[note.tone]) for note in case_notes(case)]


def baseline_line(answer: GateView | Mapping[str, Any]) -> str | None:
    """The baseline the gate was compared with, or None when it named none."""
    gate = GateView.of(answer)
    if not gate.baseline:
        return None
    line = f"baseline: {gate.baseline}"
    if gate.baseline_gate_id:
        line += f", gate {gate.baseline_gate_id}"
    elif gate.status in JUDGED:
        line += " named no gate, so no case was compared (see the warnings)"
    if gate.changed_only:
        reused = sum(1 for case in gate.cases if case.reused_from)
        line += f"; changed cases only, {reused} reused"
    return line


def _tally(cases: list[CaseView]) -> str:
    """The summary line's tail: what beside passing and failing the cases did."""
    counts = (
        ("regressed", sum(1 for c in cases if c.regression_level == "regression")),
        ("likely regressed", sum(1 for c in cases if c.regression_level == "likely")),
        ("quarantined", sum(1 for c in cases if c.quarantine is not None)),
        ("flaky", sum(1 for c in cases if c.flaky is not None)),
        ("reused", sum(1 for c in cases if c.reused_from)),
    )
    said = [f"{n} {word}" for word, n in counts if n]
    return f" ({', '.join(said)})" if said else ""


def _span_label(span: TraceSpan, meta: dict[str, Any]) -> str:
    return str(meta.get("tool_name") or meta.get("name") or span.name or "span")


def _labelled(pad: str, label: str, text: str) -> list[Text]:
    """``label text``, a multi-line text's further lines under its first (each line's
    controls made visible, as everywhere)."""
    first, *rest = text.splitlines() or [""]
    lines = [Text(visible(f"{pad}{label} {first}"))]
    lines.extend(Text(f"{pad}    {visible(line)}") for line in rest)
    return lines


def request_lines(request: dict[str, Any], indent: int, *, full: bool) -> list[Text]:
    """A model span's request: its summary line; with ``full`` (``--show-requests``) then
    the system prompt, each message (role and text), the tools and the response format."""
    pad = " " * indent
    lines = [Text(pad + visible(request_summary(request)), style="dim")]
    if not full:
        return lines
    pad += "  "
    if request.get("omitted") is not None:
        lines += _labelled(pad, "not kept:", as_text(request["omitted"]))
    if request.get("system_prompt") is not None:
        lines += _labelled(pad, "[system]", as_text(request["system_prompt"]))
    dropped = request.get("messages_dropped")
    if isinstance(dropped, int) and dropped > 0 and request.get("omitted") is None:
        lines.append(Text(f"{pad}… {dropped} older message(s) not kept"))
    messages = request.get("messages")
    for message in messages if isinstance(messages, list) else []:
        shown = message_text(message)
        lines += _labelled(pad, f"[{shown.role}]", shown.text)
    tools = request.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict):
            schema = tool.get("parameters")
            text = as_text(tool.get("name")) + (f" {as_text(schema)}" if schema is not None else "")
        else:
            text = as_text(tool)
        lines += _labelled(pad, "tool", text)
    if format_kind(request) is not None:
        lines += _labelled(pad, "response_format", as_text(request["response_format"]))
    return lines


def trace_lines(
    traces: list[TraceSpan] | list[Mapping[str, Any]],
    indent: int,
    *,
    show_requests: bool = False,
    failing_path: bool = False,
) -> list[Text]:
    """The span tree: children under their parent, siblings by span_order (then as given).
    A model span's request follows it as one line, in full with ``show_requests``.
    ``failing_path``: only the spans that did not pass and the spans on the way to them."""
    spans = [TraceSpan.of(span) for span in traces]
    keep = _failing_path(spans) if failing_path else None
    ids = {span.span_id for span in spans if span.span_id}
    roots: list[TraceSpan] = []
    children: dict[str, list[TraceSpan]] = {}
    for span in spans:
        parent = span.parent_span_id
        if parent and parent in ids and parent != span.span_id:
            children.setdefault(parent, []).append(span)
        else:
            roots.append(span)

    def order(span: TraceSpan) -> int:
        return int(span.span_order or 0)

    lines: list[Text] = []
    seen: set[str] = set()

    def walk(spans: list[TraceSpan], depth: int) -> None:
        for span in sorted(spans, key=order):
            if keep is not None and span.span_id not in keep:
                continue
            outcome = span_outcome(span.status)
            ok = outcome is Outcome.passed  # REDACTED went well too, and says so
            meta = span.meta()
            line = Text(" " * indent + "  " * depth)
            symbol, style = MARKS[outcome]
            line.append(symbol, style=style)
            line.append(" " + visible(_span_label(span, meta)))
            if not ok:  # the word as well as the mark: SKIPPED, WARNED, BLOCKED, REDACTED, ...
                word = outcome.word if outcome is not Outcome.other else str(span.status).upper()
                line.append(f" {visible(word)}", style=style)
            if span.duration_ms is not None:
                line.append(f" ({duration(span.duration_ms)})")
            error = meta.get("error") or meta.get("message")
            if outcome in WENT_WRONG and error:
                line.append(" — " + visible(truncate(as_text(error), SPAN_ERROR_AT)), style="red")
            lines.append(line)
            if isinstance(meta.get("request"), dict):
                pad = indent + 2 * depth + 2
                lines.extend(request_lines(meta["request"], pad, full=show_requests))
            span_id = span.span_id
            if span_id and span_id not in seen:
                seen.add(span_id)
                walk(children.get(span_id, []), depth + 1)

    walk(roots, 0)
    return lines


def _failing_path(spans: list[TraceSpan]) -> set[str | None]:
    """The ids of the spans that went wrong (failed, blocked, of a status not known here)
    and of every span above them; skipped and warned steps are left for --verbose."""
    parent_of = {span.span_id: span.parent_span_id for span in spans if span.span_id}
    keep: set[str | None] = set()
    for span in spans:
        if span_outcome(span.status) not in WENT_WRONG or not span.span_id:
            continue
        at: str | None = span.span_id
        while at is not None and at not in keep:  # each id once: a cycle ends the walk
            keep.add(at)
            at = parent_of.get(at)
    return keep


def failed_run_lines(
    failed: FailedRuns | Mapping[str, Any] | None, *, show_requests: bool = False
) -> list[Text]:
    """A failed case's drill-down: input, output, context, error and trace of shown runs."""
    detail = FailedRuns.of(failed) if failed else None
    if detail is None or not detail.shown:
        return []
    lines: list[Text] = []
    for run in detail.shown:
        run_id = visible(run.run_id)
        if run.fetch_error:
            lines.append(Text(f"      Run {run_id} (could not load: {visible(run.fetch_error)})"))
            continue
        lines.append(Text(f"      Run {run_id}"))
        for label, value in (("Input:  ", run.input), ("Output: ", run.output)):
            if value not in (None, ""):
                lines.append(Text(f"        {label} {visible(truncate(as_text(value)))}"))
        if run.run_context:
            lines.append(Text(f"        Context: {visible(truncate(as_text(run.run_context)))}"))
        if run.error:
            lines.append(Text(f"        Error:   {visible(truncate(run.error))}", style="red"))
        if run.traces:
            lines.append(Text("        Trace:"))
            lines.extend(trace_lines(run.traces, indent=10, show_requests=show_requests))
    remaining = (detail.total_failed or 0) - len(detail.shown)
    if remaining > 0:
        lines.append(Text(f"      … and {remaining} more failed run(s) not shown"))
    return lines


def failed_cases(cases: list[CaseView]) -> list[CaseView]:
    """The cases with a reason that did not pass, those that fail the gate first (a
    quarantined failure after them): the first is the one the terminal shows collapsed."""
    failed = [c for c in cases if c.passed is not True and c.failure_reason]
    return sorted(failed, key=lambda c: c.quarantine is not None)


def first_failure_lines(case: CaseView, *, show_requests: bool = False) -> list[Text]:
    """The first failed run of a case, collapsed: its first failing check, its error, and
    only the spans that did not pass with those on the way to them."""
    lines = [Text("    " + visible(truncate(first_check(case.failure_reason or ""))), style="red")]
    detail = case.failed_runs
    run: ShownRun | None = detail.shown[0] if detail is not None and detail.shown else None
    if run is not None and run.fetch_error:
        why = visible(run.fetch_error)
        lines.append(Text(f"    (run {visible(run.run_id)} could not be loaded: {why})"))
    if run is None or run.fetch_error:
        return lines
    if run.error:
        lines.append(Text(f"    Error: {visible(truncate(run.error, SPAN_ERROR_AT * 2))}"))
    if run.traces:
        path = trace_lines(run.traces, indent=4, show_requests=show_requests, failing_path=True)
        if path:
            lines.append(Text(f"    Spans on the way (run {visible(run.run_id)}):"))
            lines.extend(path)
    return lines


def render_results(
    console: Console,
    answer: GateView | Mapping[str, Any],
    *,
    show_requests: bool = False,
    verbose: bool = False,
) -> None:
    """The gate's results, the summary last, so a terminal's last screen is what a person
    reads first: the details (every failed run's trace with ``verbose``, else the first
    failed run collapsed), the warnings and notes, the gate's facts, the failures grouped by
    cause, the results table, the verdict line, the page's URL.
    ``show_requests``: each model span's request in full, not only its summary line."""
    gate = GateView.of(answer)
    cases = gate.cases

    def say(text: Text | str) -> None:
        console.print(text if isinstance(text, Text) else Text(text), soft_wrap=True)

    failed = failed_cases(cases)
    if failed and verbose:
        say("")
        say("  → Failure details:")
        for case in failed:
            style = "yellow" if case.quarantine else "red"
            line = Text("    ✗ ", style=style)
            quarantined = " (quarantined)" if case.quarantine else ""
            line.append(
                visible(f"{case_label(case)}{quarantined}: {case.failure_reason}"), style=style
            )
            say(line)
            for text in failed_run_lines(case.failed_runs, show_requests=show_requests):
                say(text)
    elif failed:
        first = failed[0]
        say("")
        say(Text(f"  → First failure: {visible(case_label(first))}", style="bold"))
        for text in first_failure_lines(first, show_requests=show_requests):
            say(text)
        if len(failed) > 1 or first.failed_runs is not None:
            say(Text("    (--verbose: every failed run with its whole trace)", style="dim"))
    reason = gate.failure_reason or gate.error
    if reason and gate.status != "passed" and not failed:
        say("")
        say(Text(visible(f"  {gate.status}: {reason}")))
    for problem in gate.problems if reason and gate.status != "passed" else []:
        where = problem.get("file") or problem.get("suite") or ""
        message = problem.get("message") or problem.get("detail") or as_text(problem)
        say(visible(f"    - {where}: {message}" if where else f"    - {message}"))
    warnings = gate.warnings
    if warnings:
        say("")
        say(
            Text(
                f"  ⚠ {len(warnings)} warning(s): what this gate does not run as the platform "
                "would, so a pass covers less",
                style="yellow",
            )
        )
        shown = warnings if verbose else warnings[:SHOWN_WARNINGS]
        for warning in shown:
            say(visible(f"    - {warning_line(warning)}"))
        if len(shown) < len(warnings):
            say(f"    … and {len(warnings) - len(shown)} more (--verbose, or the gate page)")
    noted = [(case, notes) for case in cases if (notes := note_lines(case))]
    if noted:
        say("")
        say("  → Notes:")
        for case, notes in noted:
            say(f"    {visible(case_label(case))}")
            for note in notes:
                say(Text("      ").append_text(note))
    facts = [*model_mode_lines(gate)]
    calls = model_calls_line(gate.model_calls)
    if calls:
        facts.append(calls)
    compared = baseline_line(gate)
    if compared:
        facts.append(compared)
    sandbox = gate.sandbox or {}
    if sandbox.get("runtime"):
        gvisor = " (gVisor)" if sandbox.get("runtime") == "runsc" else ""
        facts.append(
            f"sandbox: {sandbox.get('backend', '?')}, cases under {sandbox['runtime']}{gvisor}"
        )
    if facts:
        say("")
        for fact in facts:
            say(f"  {visible(fact)}")
    groups = failure_groups(cases)
    if groups:
        say("")
        say("  → Failures by cause:")
        for group in groups:
            style = "red" if group.info.agents else "yellow"
            say(Text(f"    {visible(group.line)}", style=style))
            names = [visible(case_label(c)) for c in group.cases[:SHOWN_GROUP_CASES]]
            more = len(group.cases) - len(names)
            say("      " + ", ".join(names) + (f" and {more} more" if more > 0 else ""))
    if cases:
        say("")
        console.print(results_table(cases))
    # By outcome, as the page and JUnit count: a regressed case did not pass the gate.
    passed = sum(1 for c in cases if counts_as_passed(c))
    say("")
    status = str(gate.status or "unknown")
    symbol, style = MARKS[Outcome.passed if status == "passed" else Outcome.failed]
    verdict = Text(f"  {symbol} ", style=style)
    verdict.append(f"{passed}/{len(cases)} cases passed{_tally(cases)}.", style="bold")
    verdict.append(f"  gate {visible(gate.id)}: ")
    verdict.append(visible(status.upper()), style=f"bold {style}")
    say(verdict)
    if gate.html_url:
        say(f"  {visible(gate.html_url)}")


# Agents named in the model mode line; the rest are counted (GET /v1/gates/{id} has all).
SHOWN_AGENT_MODES = 10
# What a gate's model_mode that is no agent's mode means (the results page says the same).
MODE_NOTES = {"pending": "worked out in validating", "none": "no LLM agent ran"}


def model_mode_lines(answer: GateView | Mapping[str, Any]) -> list[str]:
    """The mode the gate's LLM agents ran in, each agent's, and why when it was chosen by
    default: a line, and the reason's line under it. None from a gate service too old to
    answer a mode."""
    gate = GateView.of(answer)
    mode = gate.model_mode
    if not mode:
        return []
    line = f"model mode: {mode}"
    if gate.requested_model_mode:
        line += " (forced by the submission's model_mode)"
    elif mode in MODE_NOTES:
        line += f" ({MODE_NOTES[mode]})"
    modes = gate.model_modes
    if modes:
        named = sorted(modes.items())
        shown = ", ".join(f"{agent} {each}" for agent, each in named[:SHOWN_AGENT_MODES])
        if len(named) > SHOWN_AGENT_MODES:
            shown += f" and {len(named) - SHOWN_AGENT_MODES} more"
        line += f": {shown}"
    lines = [line]
    reason = gate.model_mode_reason
    if reason:
        lines.append(f"  {reason}")
    return lines


def model_calls_line(model_calls: ModelCalls | Mapping[str, Any] | None) -> str | None:
    """The gate's model-call totals in one line, or None when it made no call: how many a
    provider answered and how many failed, and the answered ones' tokens and cost."""
    totals = ModelCalls.of(model_calls) if model_calls is not None else None
    if totals is None or not totals.calls:
        return None
    calls, cost = totals.calls, totals.cost_usd or 0.0
    tokens_in, tokens_out = totals.tokens_in or 0, totals.tokens_out or 0
    answered = totals.answered
    spent = f"tokens {tokens_in:,} in / {tokens_out:,} out, cost {money(cost)}"
    if answered is None:  # a gate service that does not tell answered calls apart
        return f"model calls: {calls:,}, {spent}"
    failed = f" ({calls - answered:,} failed)" if calls > answered else ""
    if not answered:
        return f"no model call answered{failed}"
    plural = "s" if answered != 1 else ""
    return f"{answered:,} model call{plural} answered{failed}, {spent}"


def json_result(answer: GateView | Mapping[str, Any]) -> dict[str, Any]:
    """The format CLI's --json shape: status, test_run_id (the gate id), cases (as the service
    answered them, with failed_runs), plus the gate's failure_reason, results page, model
    modes and warnings."""
    gate = GateView.of(answer)
    return {
        "status": gate.status,
        "test_run_id": gate.id,
        "failure_reason": gate.failure_reason,
        "html_url": gate.html_url,
        "labels": gate.labels,
        "model_mode": gate.model_mode,
        "model_modes": gate.model_modes,
        "model_mode_reason": gate.model_mode_reason,
        "warnings": gate.warnings,
        "cases": [case.as_answered() for case in gate.cases],
    }

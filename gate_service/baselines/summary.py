"""A gate's Markdown summary for a pull-request comment (``GET /v1/gates/{id}/summary.md``,
``gate submit --markdown``): pure, a gate's view in, text out.

A heading with the verdict and a line of counts; then, when any case needs a look, a short
table of the failed, regressed, likely-regressed, flaky, quarantined and narrow cases with
their rates, intervals, baseline rates and p-values, each linked to its page. A gate whose
cases all passed plainly is the heading and its line, nothing else.

Case names, suites and a gate's reason are a bundle's text, and a quarantine's owner and
reason an admin's: all of it is written through ``md_text``, which leaves no Markdown, HTML,
table cell, line break or mention a renderer would act on. Only our own links are links.
"""

from __future__ import annotations

import string
import unicodedata
import uuid
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

from ..client.words import cut
from ..links import case_html_url, gate_html_url

# At most this many cases are listed; the rest are counted, with the gate's page.
MAX_ROWS = 30
# A case's name in a cell is cut to this many characters (before escaping).
MAX_NAME_CHARS = 120
MAX_REASON_CHARS = 300

HEADINGS = {
    "passed": "✅ Deploy gate passed",
    "failed": "❌ Deploy gate failed",
    "error": "⚠️ Deploy gate could not judge (error)",
    "cancelled": "⏹️ Deploy gate cancelled",
}


class _Read(BaseModel):
    """Read from the REST view's attributes or its JSON alike; other fields are ignored."""

    model_config = ConfigDict(from_attributes=True, extra="ignore")


class _Baseline(_Read):
    gate_id: uuid.UUID | str | None = None
    case_id: uuid.UUID | str | None = None
    successes: int | None = None
    runs: int | None = None
    comparable: bool = False
    p_value: float | None = None


class _Interval(_Read):
    low: float
    high: float


class _Flaky(_Read):
    gates: int | None = None
    passed_gates: int | None = None


class _Quarantine(_Read):
    owner: str | None = None
    expires_at: Any = None


class SummaryCase(_Read):
    """The fields of a case (``CaseRead``) the summary reads."""

    id: uuid.UUID | str
    agent_name: str | None = None
    test_name: str = ""
    status: str = ""
    passed: bool | None = None
    successes: int = 0
    runs: int = 0
    invocations_run: int | None = None
    success_threshold: int = 0
    baseline: _Baseline | None = None
    regression_level: str | None = None
    flaky: _Flaky | None = None
    quarantine: _Quarantine | None = None
    reused_from: uuid.UUID | str | None = None
    interval: _Interval | None = None
    narrow: bool = False

    @property
    def runs_done(self) -> int:
        return self.invocations_run if self.invocations_run is not None else self.runs


class SummaryGate(_Read):
    """The fields of a gate (``GateRead``, all its cases) the summary reads."""

    id: uuid.UUID | str
    status: str
    failure_reason: str | None = None
    error: str | None = None
    baseline: str | None = None
    baseline_gate_id: uuid.UUID | str | None = None
    cases: list[SummaryCase] = []


def md_text(value: object, limit: int | None = None) -> str:
    """``value`` as inert Markdown inline text, safe in a table cell and a link's text.

    Controls, line and paragraph separators and format characters (bidi overrides, zero
    widths) are written out (``\\x0a``, ``\\u202e``); every ASCII punctuation mark Markdown
    could read is backslash-escaped (``|`` included, so a cell cannot be split); ``&``, ``<``
    and ``>`` become entities (no HTML, no entity of the text's own); ``@`` and ``#`` get a
    zero-width space after them, so no one is mentioned and no issue is referenced.
    """
    text = str(value) if limit is None else cut(str(value), limit)
    out: list[str] = []
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            code = ord(ch)
            ch = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
            out.append(ch.replace("\\", "\\\\"))
        elif ch in _ENTITIES:
            out.append(_ENTITIES[ch])
        elif ch in _ESCAPED:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "@": "@&#8203;", "#": "#&#8203;"}
_ESCAPED = frozenset(string.punctuation) - set(_ENTITIES)


def _link(text: str, url: str) -> str:
    """``[text](url)``: ``text`` already escaped, ``url`` ours (its parentheses and spaces
    percent-encoded, so it cannot end the link early)."""
    return f"[{text}]({quote(url, safe=':/?=&%#~')})"


def _rate(successes: int | None, runs: int | None) -> str:
    if successes is None or runs is None or runs < 1:
        return "—"
    return f"{successes}/{runs} ({100 * successes / runs:.0f}%)"


def _tags(case: SummaryCase) -> list[tuple[int, str]]:
    """Why the case is listed: (rank, words), most urgent first."""
    tags: list[tuple[int, str]] = []
    if case.reused_from:
        return tags  # its baseline's verdict, not this gate's: counted, not listed
    if case.status == "failed":
        tags.append((0, "failed"))
    elif case.status == "error":
        tags.append((0, "error"))
    if case.regression_level == "regression":
        tags.append((1, "regression"))
    elif case.regression_level == "likely":
        tags.append((2, "likely regression"))
    if case.flaky is not None:
        tags.append((3, f"flaky (passed {case.flaky.passed_gates} of {case.flaky.gates} gates)"))
    if case.quarantine is not None:
        until = str(case.quarantine.expires_at or "?")[:10]
        who = md_text(case.quarantine.owner or "?", MAX_NAME_CHARS)
        tags.append((4, f"quarantined ({who}, until {md_text(until)})"))
    if case.narrow:
        tags.append((5, f"narrow (threshold {case.success_threshold}%)"))
    return tags


def _counts(gate: SummaryGate) -> str:
    cases = gate.cases
    if not cases:
        return "No case was judged."
    passed = sum(1 for c in cases if c.passed is True and not c.reused_from)
    parts = [f"{passed} passed"]
    for word, n in (
        ("failed", sum(1 for c in cases if c.status == "failed")),
        ("errored", sum(1 for c in cases if c.status == "error")),
        ("reused from the baseline", sum(1 for c in cases if c.reused_from)),
    ):
        if n:
            parts.append(f"{n} {word}")
    others = len(cases) - sum(
        1 for c in cases if c.reused_from or c.status in ("passed", "failed", "error")
    )
    if others:
        parts.append(f"{others} not judged")
    return f"{len(cases)} case{'s' if len(cases) != 1 else ''}: {', '.join(parts)}."


def gate_summary(view: Any, *, public_url: str = "") -> str:
    """The gate's Markdown summary. ``view``: the gate as ``GET /v1/gates/{id}`` answers it
    (``GateRead`` or its JSON) with all its cases; ``public_url``: GATE_PUBLIC_URL, which
    the links are absolute under (paths when empty)."""
    gate = SummaryGate.model_validate(view)
    page = gate_html_url(public_url, gate.id)
    heading = HEADINGS.get(gate.status, f"⏳ Deploy gate {md_text(gate.status)}")
    lines = [f"### {heading}", ""]
    facts = [_counts(gate)]
    if gate.baseline_gate_id:
        short = str(gate.baseline_gate_id)[:8]
        facts.append(
            "Compared with baseline gate "
            + _link(f"`{short}`", gate_html_url(public_url, gate.baseline_gate_id))
            + "."
        )
    elif gate.baseline and gate.status in HEADINGS:
        facts.append(f"Baseline {md_text(gate.baseline, MAX_NAME_CHARS)} named no gate.")
    facts.append(_link("Results", page))
    lines.append(" ".join(facts))
    if gate.status == "error":
        reason = gate.failure_reason or gate.error or "the gate errored"
        lines += ["", f"**Why:** {md_text(reason, MAX_REASON_CHARS)}"]
    listed = [(case, tags) for case in gate.cases if (tags := _tags(case))]
    if not listed:
        return "\n".join(lines) + "\n"
    listed.sort(key=lambda item: min(rank for rank, _ in item[1]))  # stable: suite order
    with_baseline = bool(gate.baseline_gate_id) or any(c.baseline for c, _ in listed)
    header = ["Case", "Why listed", "Rate", "95% interval"]
    if with_baseline:
        header += ["Baseline", "p"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for case, tags in listed[:MAX_ROWS]:
        label = md_text(f"{case.agent_name}::{case.test_name}", MAX_NAME_CHARS)
        interval = case.interval
        row = [
            _link(label, case_html_url(public_url, case.id)),
            ", ".join(words for _, words in tags),
            _rate(case.successes, case.runs_done),
            "—" if interval is None else f"{interval.low:.1f}-{interval.high:.1f}%",
        ]
        if with_baseline:
            row += _baseline_cells(case)
        lines.append("| " + " | ".join(row) + " |")
    if len(listed) > MAX_ROWS:
        lines += ["", f"… and {len(listed) - MAX_ROWS} more on the {_link('gate page', page)}."]
    return "\n".join(lines) + "\n"


def _baseline_cells(case: SummaryCase) -> list[str]:
    base = case.baseline
    if base is None:
        return ["—", "—"]
    if not base.comparable:
        return ["new" if base.case_id is None else "not comparable", "—"]
    p = "—" if base.p_value is None else f"{base.p_value:.3g}"
    return [_rate(base.successes, base.runs), p]

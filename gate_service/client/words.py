"""The words and numbers a person reads, said once for the pages, `gate submit` and JUnit.

An outcome has one word everywhere (a case's: passed, failed, error, skipped, pending; a
step's: passed, failed, skipped, warned, blocked), so a guardrail that let text through reads
PASSED on the page and in the terminal alike, and a skipped one never wears a pass's colour.
Costs carry their currency and four significant figures, durations are in human units, and a
cut text ends with "…" and how much was cut.
"""

from __future__ import annotations

import math
from enum import StrEnum

from .shapes import CaseView


class Outcome(StrEnum):
    """What happened, in the word every surface prints (upper-cased on badges)."""

    passed = "passed"
    failed = "failed"
    error = "error"  # a case the gate could not judge
    skipped = "skipped"
    warned = "warned"  # a guardrail in warn mode that found something
    blocked = "blocked"  # a guardrail that stopped the text (it did its job)
    redacted = "redacted"  # a guardrail that masked part of the text and let the rest through
    pending = "pending"  # not judged yet
    other = "other"  # a step status this code does not know (shown as it is)

    @property
    def word(self) -> str:
        return self.value.upper()


def case_outcome(case: CaseView) -> Outcome:
    """A case's outcome, as JUnit reports it: a case that regressed against its baseline
    failed even when its threshold held; a quarantined failure, a reused case and a case
    that never ran are skipped (reported, and none fails the gate)."""
    status = case.status
    if case.reused_from:
        return Outcome.skipped  # not run: its baseline's verdict stands
    regressed = case.regression_level == "regression"
    if case.passed is True and not regressed:
        return Outcome.passed
    if case.passed is True or case.passed is False or status == "failed":
        return Outcome.skipped if case.quarantine else Outcome.failed
    if status == "error":
        return Outcome.error
    if status in (None, "queued", "running"):
        return Outcome.pending
    return Outcome.skipped  # cancelled, or never judged


def counts_as_passed(case: CaseView) -> bool:
    """Whether the verdict line counts the case as passed: it passed (a regression did
    not), or it was reused from a baseline where it passed (its verdict stands)."""
    return case_outcome(case) is Outcome.passed or bool(case.reused_from)


def case_marks(case: CaseView) -> list[str]:
    """Why a case's outcome is not the plain one, as short upper-case marks beside it."""
    marks = []
    if case.reused_from:
        marks.append("REUSED")
    if case.quarantine is not None:
        marks.append("QUARANTINED")
    if case.regression_level == "regression":
        marks.append("REGRESSED")
    if case.flaky is not None:
        marks.append("FLAKY")
    if case.status == "cancelled":
        marks.append("CANCELLED")
    return marks


# A step's (a span's, a guardrail's) status as the runner writes it, and its outcome.
_SPAN_OUTCOMES = {
    "ok": Outcome.passed,
    "passed": Outcome.passed,
    "completed": Outcome.passed,
    "error": Outcome.failed,
    "failed": Outcome.failed,
    "timeout": Outcome.failed,
    "skipped": Outcome.skipped,
    "warned": Outcome.warned,
    "blocked": Outcome.blocked,
    "redacted": Outcome.redacted,
}
# Steps that went as they should: no word beside the mark in the terminal, off a failing path.
WENT_WELL = frozenset({Outcome.passed, Outcome.redacted})
# Steps that explain a failure: what the terminal's collapsed failing path keeps.
WENT_WRONG = frozenset({Outcome.failed, Outcome.error, Outcome.blocked, Outcome.other})


def span_outcome(status: object) -> Outcome:
    return _SPAN_OUTCOMES.get(str(status), Outcome.other)


def span_word(status: object) -> str:
    """The badge of a step: its outcome's word, or its own status for one not known here."""
    outcome = span_outcome(status)
    return str(status).upper() if outcome is Outcome.other else outcome.word


# The terminal's mark for each outcome: a symbol, and the colour that only repeats it.
MARKS = {
    Outcome.passed: ("✓", "green"),
    Outcome.failed: ("✗", "red"),
    Outcome.error: ("✗", "red"),
    Outcome.skipped: ("○", "dim"),
    Outcome.warned: ("!", "yellow"),
    Outcome.blocked: ("⊘", "magenta"),
    Outcome.redacted: ("✓", "green"),
    Outcome.pending: ("…", "dim"),
    Outcome.other: ("·", ""),
}


def _finite(value: object) -> float | None:
    """A number as a float, or None: a bundle's own span can carry any JSON number, 10**400
    included, which float() refuses."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


# Past these, a figure is not a cost or a duration but a bundle's number: shown as "—".
MAX_SHOWN = 1e15
MIN_COST = 1e-9  # below a billionth of a dollar: $0.00


def money(usd: float | int | None) -> str:
    """A cost to four significant figures, with its currency: ``$0.001280``, ``$12.35``;
    from $100 on, to the cent (``$1,234.50``: never a cent the rounding made up)."""
    usd = _finite(usd)
    if usd is None or abs(usd) >= MAX_SHOWN:
        return "—"
    if abs(usd) < MIN_COST:
        return "$0.00"
    rounded = float(f"{usd:.4g}")  # first, so 0.99996 counts as 1.000, not 0.99996
    places = 3 - math.floor(math.log10(abs(rounded)))
    if places < 2:
        return f"${usd:,.2f}"
    return f"${rounded:,.{places}f}"


def duration(ms: float | int | None) -> str:
    """``850 ms``, ``1.2 s``, ``2 min 5 s``, ``1 h 3 min``."""
    finite = _finite(ms)
    if finite is None or finite >= MAX_SHOWN:
        return "—"
    ms = max(0, int(finite))
    if ms < 1000:
        return f"{ms} ms"
    if ms < 59_950:  # from there on, "60.0 s" would be the tenths' rounding
        return f"{ms / 1000:.1f} s"
    minutes, rest = divmod(round(ms / 1000), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def cut(text: str | None, limit: int) -> str:
    """``text`` kept to ``limit`` characters; a cut one ends ``…[N more characters]``."""
    if not text:
        return ""
    if len(text) <= limit:
        return text
    more = len(text) - limit
    return f"{text[:limit]}…[{more:,} more character{'s' if more != 1 else ''}]"

"""What a case's verdict alone does not say, as plain sentences: its comparison with the
gate's baseline, its quarantine, its flakiness, a narrow interval, an early stop, a reuse.

Shared by the terminal (``render``, which makes controls visible and colours by tone) and
JUnit (``junit``, which keeps what XML can hold): the text here is raw, never escaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .shapes import CaseView


class Tone(StrEnum):
    """How loud a note is: ``fail`` fails the gate, ``warn`` asks for a look, ``quiet`` is
    context, ``plain`` is neither."""

    fail = "fail"
    warn = "warn"
    quiet = "quiet"
    plain = "plain"


@dataclass(frozen=True)
class Note:
    text: str
    tone: Tone = Tone.plain


def short_id(value: object) -> str:
    """A gate's or case's id as a person compares it: its first 8 characters."""
    return str(value or "?")[:8]


def rate(successes: int | None, runs: int | None) -> str:
    """``9/10 (90%)``; ``?`` for counts an answer lacks."""
    if successes is None or runs is None or runs < 1:
        return "?"
    return f"{successes}/{runs} ({100 * successes / runs:.0f}%)"


def interval_text(low: float | None, high: float | None) -> str:
    """A 95% interval in percent, ``44.4-97.5%``."""
    if low is None or high is None:
        return "?"
    return f"{low:.1f}-{high:.1f}%"


def p_text(p_value: float | None) -> str:
    return "?" if p_value is None else f"{p_value:.3g}"


def quarantine_text(case: CaseView) -> str | None:
    """``quarantined by OWNER until DATE: REASON``, or None when it ran under none."""
    quarantine = case.quarantine
    if quarantine is None:
        return None
    until = (quarantine.expires_at or "?")[:10]  # the day: ISO 8601 starts with it
    line = f"quarantined by {quarantine.owner or '?'} until {until}"
    return f"{line}: {quarantine.reason}" if quarantine.reason else line


def regression_text(case: CaseView) -> str | None:
    """A regression's or likely regression's sentence, both rates and p; else None."""
    base = case.baseline
    if base is None or base.comparable is not True:
        return None
    if case.regression_level not in ("regression", "likely"):
        return None
    word = "regressed" if case.regression_level == "regression" else "likely regressed"
    return (
        f"{word} against baseline gate {short_id(base.gate_id)}: "
        f"{rate(base.successes, base.runs)} then, {rate(case.successes, case.runs_done())} now, "
        f"one-sided Fisher p = {p_text(base.p_value)}"
    )


def case_notes(case: CaseView) -> list[Note]:
    """The case's notes, in the order a reader needs them."""
    notes: list[Note] = []
    base = case.baseline
    if case.reused_from:
        gate = short_id(base.gate_id) if base is not None else "the baseline"
        notes.append(
            Note(
                f"reused: it passed in baseline gate {gate} with the same closure, so it was "
                f"not run again (that gate's case {short_id(case.reused_from)})",
                Tone.quiet,
            )
        )
    elif (regressed := regression_text(case)) is not None:
        if case.regression_level == "likely":
            notes.append(Note(f"{regressed}; a warning", Tone.warn))
        elif case.quarantine:
            notes.append(Note(f"{regressed}; quarantined, so it does not fail the gate", Tone.warn))
        else:
            notes.append(Note(f"{regressed}; this fails the gate", Tone.fail))
    elif base is not None and base.comparable is not True:
        if base.case_id is None:
            notes.append(Note("new since the baseline", Tone.quiet))
        else:
            why = f": {base.why}" if base.why else ""
            notes.append(Note(f"not compared with the baseline{why}", Tone.quiet))
    quarantined = quarantine_text(case)
    if quarantined is not None:
        if case.status == "failed" and not case.reused_from:
            quarantined += " (its failure does not fail the gate)"
        notes.append(Note(quarantined, Tone.warn))
    flaky = case.flaky
    if flaky is not None:
        notes.append(
            Note(
                f"flaky: passed {flaky.passed_gates} of its last {flaky.gates} gates with this "
                f"closure, {rate(flaky.successes, flaky.runs)} of their runs "
                f"(95% interval {interval_text(flaky.low, flaky.high)})",
                Tone.warn,
            )
        )
    if case.narrow and case.interval is not None:
        shown = interval_text(case.interval.low, case.interval.high)
        notes.append(
            Note(
                f"narrow: its 95% interval {shown} holds the {case.success_threshold}% "
                "threshold, so more runs would tell"
            )
        )
    if case.stopped_early and not case.reused_from:
        notes.append(
            Note(
                f"stopped early after {case.runs_done()} of {case.runs} runs: the verdict "
                "could no longer change",
                Tone.quiet,
            )
        )
    return notes

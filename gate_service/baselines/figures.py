"""What a case answers beside its verdict (``gates.schemas.CaseRead``): its pass rate's
Wilson interval, whether its threshold lies inside it, and whether it regressed.

Pure: a case row (or its numbers) in, values out; ``gates.views`` and ``history`` call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import func

from ..models import Case, CaseStatus
from .stats import Interval, wilson

# A case with a verdict of its agent's: what history, comparison and intervals count.
JUDGED = (CaseStatus.passed.value, CaseStatus.failed.value)
# A case's invocations run, in SQL (``runs_done`` in Python).
RAN = func.coalesce(Case.invocations_run, Case.runs)


class RunCounts(Protocol):
    """A case row, or a case as the API answers it."""

    @property
    def runs(self) -> int: ...

    @property
    def invocations_run(self) -> int | None: ...


def runs_done(case: RunCounts) -> int:
    """The invocations a case ran: fewer than its runs after an early stop, more under the
    Wilson rule; its runs for a case stored before either was counted."""
    return case.invocations_run if case.invocations_run is not None else case.runs


# A case's interval is answered from this many invocations on: one run is a verdict, not a
# rate ("every case with runs > 1 carries its Wilson 95% interval").
LEAST_RUNS_FOR_AN_INTERVAL = 2


def interval_of(successes: int, runs: int, *, least_runs: int = 1) -> Interval | None:
    """The Wilson interval of ``successes`` of ``runs``, or None with fewer than
    ``least_runs`` runs or counts no rate has (successes outside 0..runs)."""
    if runs < max(least_runs, 1) or not 0 <= successes <= runs:
        return None
    return wilson(successes, runs)


@dataclass(frozen=True)
class CaseFigures:
    interval: Interval | None
    narrow: bool
    regression: bool

    def answered(self) -> dict[str, Any]:
        """The three fields as CaseRead answers them."""
        return {
            "interval": (
                {"low": self.interval.low, "high": self.interval.high}
                if self.interval is not None
                else None
            ),
            "narrow": self.narrow,
            "regression": self.regression,
        }


def case_figures(case: Case) -> CaseFigures:
    """A judged case's interval over the invocations it ran (``invocations_run``, else its
    ``runs``), null below two of them or before a verdict; ``narrow`` when its threshold lies
    strictly inside it; ``regression`` when the worker found it regressed against the gate's
    baseline (a likely regression is a warning, not this)."""
    interval = None
    if case.status in JUDGED:
        interval = interval_of(
            case.successes, runs_done(case), least_runs=LEAST_RUNS_FOR_AN_INTERVAL
        )
    return CaseFigures(
        interval=interval,
        narrow=interval is not None and interval.holds(case.success_threshold),
        regression=case.regression_level == "regression",
    )

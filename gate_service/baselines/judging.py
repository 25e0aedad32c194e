"""The worker's part of baselines, inside its own transactions (it owns them):

- ``resolve_baseline`` in validating: the gate the submission's ``baseline`` names now.
- ``annotate_cases`` before the verdict: each judged case's quarantine, baseline comparison
  and flakiness, stored on the case; ``lifecycle.finish_gate`` then reads them (a quarantined
  failure does not fail the gate, a regression does).

The rules (docs/baselines.md):
- **Comparable**: the baseline holds a judged case with the same identity and the same case
  definition (its own YAML: otherwise the rates are of two different tests), which ran every
  invocation. Anything else is reported as new or not comparable, never compared.
- **Regression**: one-sided Fisher exact p < GATE_REGRESSION_P, a drop of at least
  GATE_REGRESSION_MIN_DROP points, from a baseline rate of at least
  GATE_REGRESSION_MIN_BASELINE; **likely**: p < GATE_LIKELY_REGRESSION_P and a drop of at
  least GATE_LIKELY_REGRESSION_MIN_DROP (a warning). n8n's thresholds by default.
- **Flaky**: among the case's last GATE_HISTORY_GATES judged gates with its closure hash
  (this one included), both verdicts occur, and the last GATE_FLAKY_CLEAR_PASSES are not all
  passes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from gate_runner.runtime_errors import OUTSIDE_KINDS, REQUEST_REJECTED

from ..config import Settings
from ..models import Case, CaseQuarantine, CaseStatus, Gate, GateStatus, ModelCall, utcnow
from .figures import JUDGED, RAN, runs_done
from .spec import parse_baseline
from .stats import fisher_drop, wilson

MAX_NAMED_IN_WARNING = 5


def resolve_baseline(session: Session, gate: Gate) -> tuple[uuid.UUID | None, str | None]:
    """The gate ``gate.baseline`` names now, or (None, why not): an unknown gate id, or no
    passing gate with the label yet (a branch's first gate)."""
    if not gate.baseline:
        return None, None
    spec = parse_baseline(gate.baseline)  # checked at submission; parsed again, cheaply
    # Another gate of the project, never the gate itself.
    others = (Gate.project_id == gate.project_id, Gate.id != gate.id)
    if spec.gate_id is not None:
        named = session.execute(
            select(Gate.id, Gate.status).where(*others, Gate.id == spec.gate_id)
        ).one_or_none()
        if named is None:
            return None, f"baseline gate {spec.gate_id} is not a gate of this project"
        if not GateStatus(named.status).terminal:
            return None, f"baseline gate {named.id} has not finished (it is {named.status})"
        return named.id, None
    found = session.scalar(
        select(Gate.id)
        .where(
            *others,
            Gate.status == GateStatus.passed.value,
            Gate.created_at < gate.created_at,
            Gate.labels.contains({spec.label_key: spec.label_value}),
        )
        .order_by(Gate.created_at.desc())
        .limit(1)
    )
    if found is None:
        return None, f"no passing gate labelled {spec.label_key}={spec.label_value} yet"
    return found, None


@dataclass(frozen=True)
class Reuse:
    """A case an incremental gate reports from its baseline instead of running it."""

    case: Case
    base: Case
    why: str


def reusable_cases(
    session: Session, gate: Gate, why_not: Callable[[str], str | None]
) -> tuple[list[Reuse], dict[str, int], int]:
    """The gate's queued cases an incremental gate may take from its baseline: the baseline
    holds a passing case with the same identity and closure hash, and ``why_not(agent)``
    (closure.why_not_reusable) says its inputs are deterministic. Also how many were not
    reusable, by reason, and how many an earlier attempt of the job reused already (for the
    gate's note)."""
    if not gate.changed_only or gate.baseline_gate_id is None:
        return [], {}, 0
    already = session.scalar(
        select(func.count()).where(Case.gate_id == gate.id, Case.reused_from.is_not(None))
    )
    cases = session.scalars(
        select(Case).where(Case.gate_id == gate.id, Case.status == CaseStatus.queued.value)
    ).all()
    base = {
        c.case_key: c
        for c in session.scalars(select(Case).where(Case.gate_id == gate.baseline_gate_id))
        if c.case_key is not None
    }
    found: list[Reuse] = []
    not_reused: dict[str, int] = {}

    def skip(why: str) -> None:
        not_reused[why] = not_reused.get(why, 0) + 1

    calls = call_counts(session, [c.id for c in base.values()])
    for case in cases:
        match = base.get(case.case_key) if case.case_key is not None else None
        if match is None:
            skip("new since the baseline")
        elif match.status != CaseStatus.passed.value:
            skip(f"{match.status} in the baseline")
        elif match.closure_hash is None or match.closure_hash != case.closure_hash:
            skip("its closure changed since the baseline")
        elif (reason := why_not(case.agent_name)) is not None:
            skip(f"not deterministic: {reason}")
        elif calls.get(match.id, Calls()).total:
            # What its code did, not only what its YAML says: a case container reaches
            # nothing but its gateway channel, and this one used it (a model, a page, a tool).
            skip("not deterministic: it called out through the model gateway in the baseline")
        elif match.flaky is not None:
            skip("flaky in the baseline")
        else:
            found.append(
                Reuse(
                    case,
                    match,
                    f"reused from baseline gate {gate.baseline_gate_id}: its closure hash is "
                    "unchanged, it passed there, and its agents run scripted or replay, "
                    "calling nothing outside the bundle",
                )
            )
    return found, not_reused, int(already or 0)


@dataclass(frozen=True)
class Calls:
    """A case's calls through its model gateway channel, and those that failed for a reason
    outside the agent (the provider or the gate: runtime_errors.outside_the_agent's kinds)."""

    total: int = 0
    outside: int = 0


def call_counts(session: Session, case_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Calls]:
    """``Calls`` of each of these cases that made any (one statement, grouped in Postgres)."""
    if not case_ids:
        return {}
    provider_status = ModelCall.error["provider_status"].as_integer()
    outside = or_(
        ModelCall.status.in_(OUTSIDE_KINDS),
        and_(
            ModelCall.status == "provider",
            or_(provider_status.is_(None), provider_status.not_in(REQUEST_REJECTED)),
        ),
    )
    rows = session.execute(
        select(
            ModelCall.case_id,
            func.count(),
            func.count().filter(outside),
        )
        .where(ModelCall.case_id.in_(case_ids))
        .group_by(ModelCall.case_id)
    )
    return {case_id: Calls(int(total), int(failed)) for case_id, total, failed in rows}


@dataclass(frozen=True)
class Comparison:
    """A case against its baseline's case: what ``Case.baseline`` stores."""

    level: str  # none, likely, regression; "" when not compared
    stored: dict[str, Any]


def compare(
    case: Case,
    base: Case | None,
    baseline_gate_id: uuid.UUID,
    settings: Settings,
    calls: dict[uuid.UUID, Calls] | None = None,
) -> Comparison:
    """The case's comparison with ``base``, its baseline gate's case with its identity;
    ``calls``: both cases' gateway calls (``call_counts``)."""
    calls = calls or {}
    if base is None:
        why = "new since the baseline: the baseline gate has no case with this identity"
        return Comparison("", _not_comparable(baseline_gate_id, None, why))
    if base.status not in JUDGED:
        why = f"the baseline's case was not judged (it is {base.status})"
        return Comparison("", _not_comparable(baseline_gate_id, base, why))
    if base.definition_hash is None or base.definition_hash != case.definition_hash:
        why = "the case's own YAML changed since the baseline, so the rates are of two tests"
        return Comparison("", _not_comparable(baseline_gate_id, base, why))
    provider = calls.get(case.id, Calls()).outside + calls.get(base.id, Calls()).outside
    if provider:
        why = (
            f"{provider} model call(s) of the two failed outside the agent (the provider or "
            "the gate: a rate limit, an unreachable endpoint, a budget), so the rates would "
            "compare those, not the agent"
        )
        return Comparison("", _not_comparable(baseline_gate_id, base, why))
    base_runs = runs_done(base)
    if base.stopped_early or base_runs < 1:
        why = "the baseline's case stopped early, so its rate is not a full sample"
        return Comparison("", _not_comparable(baseline_gate_id, base, why))
    runs = runs_done(case)
    successes = case.successes
    p_value = fisher_drop(base.successes, base_runs, successes, runs)
    base_rate = 100 * base.successes / base_runs
    drop = base_rate - 100 * successes / runs
    level = "none"
    if (
        p_value < settings.regression_p
        and drop >= settings.regression_min_drop
        and base_rate >= settings.regression_min_baseline
    ):
        level = "regression"
    elif p_value < settings.likely_regression_p and drop >= settings.likely_regression_min_drop:
        level = "likely"
    return Comparison(
        level,
        {
            "gate_id": str(baseline_gate_id),
            "case_id": str(base.id),
            "successes": base.successes,
            "runs": base_runs,
            "comparable": True,
            "why": None,
            "p_value": round(p_value, 6),
            "drop_points": round(drop, 2),
        },
    )


def _not_comparable(gate_id: uuid.UUID, base: Case | None, why: str) -> dict[str, Any]:
    return {
        "gate_id": str(gate_id),
        "case_id": str(base.id) if base is not None else None,
        "successes": base.successes if base is not None else None,
        "runs": runs_done(base) if base is not None else None,
        "comparable": False,
        "why": why,
        "p_value": None,
        "drop_points": None,
    }


def regression_reason(case: Case) -> str:
    """The failure_reason part for a regressed case: the case, both rates, the p-value."""
    base = case.baseline or {}
    runs = runs_done(case)
    return (
        f"{case.agent_name}::{case.test_name} regressed against baseline gate "
        f"{base.get('gate_id')}: {base.get('successes')}/{base.get('runs')} "
        f"({_percent(base.get('successes'), base.get('runs'))}) then, "
        f"{case.successes}/{runs} ({_percent(case.successes, runs)}) now, one-sided Fisher "
        f"exact p = {base.get('p_value'):.4g}"
    )


def _percent(successes: Any, runs: Any) -> str:
    if not isinstance(successes, int) or not isinstance(runs, int) or runs < 1:
        return "?"
    return f"{100 * successes / runs:.0f}%"


def annotate_cases(
    session: Session, gate: Gate, settings: Settings, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Store each judged case's quarantine, baseline comparison and flakiness (see the
    module); the warnings to add to the gate's (likely regressions, a baseline not found)."""
    now = now or utcnow()
    cases = session.scalars(select(Case).where(Case.gate_id == gate.id)).all()
    judged = [c for c in cases if c.status in JUDGED and c.case_key is not None]
    if not judged:
        return []
    keys = {c.case_key for c in judged}
    quarantines = {
        q.case_key: q
        for q in session.scalars(
            select(CaseQuarantine).where(
                CaseQuarantine.project_id == gate.project_id,
                CaseQuarantine.expires_at > now,
                CaseQuarantine.case_key.in_(keys),
            )
        )
    }
    base_cases: dict[str, Case] = {}
    if gate.baseline_gate_id is not None:
        base_cases = {
            c.case_key: c
            for c in session.scalars(
                select(Case).where(Case.gate_id == gate.baseline_gate_id, Case.case_key.in_(keys))
            )
            if c.case_key is not None
        }
    history = _histories(session, gate, settings.history_gates, keys)
    calls = (
        call_counts(session, [c.id for c in (*judged, *base_cases.values())]) if base_cases else {}
    )
    likely: list[Case] = []
    for case in judged:
        assert case.case_key is not None
        if case.reused_from is not None:  # not run: its baseline said all there is to say
            continue
        quarantine = quarantines.get(case.case_key)
        case.quarantine = (
            {
                "owner": quarantine.owner,
                "reason": quarantine.reason,
                "expires_at": quarantine.expires_at.isoformat(),
            }
            if quarantine is not None
            else None
        )
        if gate.baseline_gate_id is not None:
            comparison = compare(
                case, base_cases.get(case.case_key), gate.baseline_gate_id, settings, calls
            )
            case.baseline = comparison.stored
            case.regression_level = comparison.level or None
            if comparison.level == "likely":
                likely.append(case)
        case.flaky = flakiness(
            [*history.get((case.case_key, case.closure_hash), []), _verdict(case)],
            settings.flaky_clear_passes,
        )
    warnings = []
    if likely:
        named = "; ".join(
            f"{c.agent_name}::{c.test_name} {(c.baseline or {}).get('successes')}/"
            f"{(c.baseline or {}).get('runs')} then, {c.successes}/{runs_done(c)} now "
            f"(p = {(c.baseline or {}).get('p_value'):.4g})"
            for c in likely[:MAX_NAMED_IN_WARNING]
        )
        more = len(likely) - MAX_NAMED_IN_WARNING
        warnings.append(
            {
                "file": likely[0].suite,
                "agent": likely[0].agent_name,
                "key": "baseline.likely_regression",
                "support": "partial",
                "message": f"{len(likely)} case(s) likely regressed against the baseline: "
                + named
                + (f"; and {more} more" if more > 0 else ""),
            }
        )
    return warnings


@dataclass(frozen=True)
class Verdict:
    """One gate's verdict of a case, as its history holds it."""

    passed: bool
    successes: int
    runs: int


def _verdict(case: Case) -> Verdict:
    return Verdict(case.status == CaseStatus.passed.value, case.successes, runs_done(case))


def _histories(
    session: Session, gate: Gate, limit: int, keys: set[str | None]
) -> dict[tuple[str | None, str | None], list[Verdict]]:
    """Each case key's earlier verdicts in the project (closure hash by closure hash), oldest
    first: at most ``limit - 1`` per key and hash, this gate's own verdict making ``limit``.
    Reused cases are left out: they repeat a verdict, they did not run."""
    ranked = (
        select(
            Case.case_key,
            Case.closure_hash,
            Case.status,
            Case.successes,
            RAN.label("ran"),
            Gate.created_at,
            func.row_number()
            .over(
                partition_by=(Case.case_key, Case.closure_hash),
                order_by=Gate.created_at.desc(),
            )
            .label("rank"),
        )
        .join(Gate, Gate.id == Case.gate_id)
        .where(
            Gate.project_id == gate.project_id,
            Gate.id != gate.id,
            Gate.created_at < gate.created_at,
            Case.case_key.in_(keys),
            Case.status.in_(JUDGED),
            Case.reused_from.is_(None),
        )
        .subquery()
    )
    rows = session.execute(
        select(ranked)
        .where(ranked.c.rank < limit)
        .order_by(ranked.c.case_key, ranked.c.closure_hash, ranked.c.created_at)
    )
    found: dict[tuple[str | None, str | None], list[Verdict]] = {}
    for row in rows:
        found.setdefault((row.case_key, row.closure_hash), []).append(
            Verdict(row.status == CaseStatus.passed.value, row.successes, max(row.ran, 1))
        )
    return found


def flakiness(verdicts: Sequence[Verdict], clear_after: int) -> dict[str, Any] | None:
    """The stored ``flaky`` of a case with these verdicts (oldest first, its own last): None
    unless both verdicts occur and the last ``clear_after`` are not all passes."""
    if len({v.passed for v in verdicts}) < 2:
        return None
    tail = verdicts[-clear_after:]
    if len(tail) == clear_after and all(v.passed for v in tail):
        return None
    successes = sum(v.successes for v in verdicts)
    runs = sum(v.runs for v in verdicts)
    interval = wilson(successes, runs)
    return {
        "gates": len(verdicts),
        "passed_gates": sum(1 for v in verdicts if v.passed),
        "successes": successes,
        "runs": runs,
        "low": interval.low,
        "high": interval.high,
    }


def reuse_note(
    gate: Gate, reused: int, total: int, not_reused: Mapping[str, int]
) -> dict[str, Any]:
    """The gate's note on an incremental gate: how many cases it reused, and why the others
    ran (each reused case says why it could be, in its ``baseline.why``)."""
    ran = "; ".join(f"{count} {why}" for why, count in sorted(not_reused.items())[:10])
    return {
        "file": "",
        "agent": "",
        "key": "baseline.reused",
        "support": "partial",
        "message": f"changed_only: {reused} of {total} case(s) reused from baseline gate "
        f"{gate.baseline_gate_id} (closure unchanged, passed there, scripted or replay)"
        + (f"; the others ran: {ran}" if ran else ""),
    }


def no_baseline_warning(gate: Gate, why: str) -> dict[str, Any]:
    """The gate's warning when its baseline names no gate now: nothing is compared."""
    return {
        "file": "",
        "agent": "",
        "key": "baseline",
        "support": "partial",
        "message": f"baseline {gate.baseline!r}: {why}; no case was compared with a baseline",
    }

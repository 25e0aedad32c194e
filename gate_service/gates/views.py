"""Every read of gates, their cases and runs, as the API, the pages and the Connic routes
answer them.

The routes, ``gate_service.ui`` and ``gate_service.connic_api`` read gates only here; the
worker never imports this module (an import-linter contract). The one thing it shares with
``lifecycle`` is ``get_gate``, the gate row both sides load, which lives there. Functions
take the session first and write nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..baselines.figures import case_figures
from ..errors import NotFound
from ..links import gate_html_url
from ..models import Bundle, Case, CaseStatus, Gate, GateStatus, Run
from ..results import carried
from ..stored_runs import read_back
from .lifecycle import get_gate
from .model_calls import model_call_totals, read_recordings
from .schemas import (
    BundleRead,
    CaseRead,
    GateList,
    GateRead,
    GateSummary,
    ModelCallTotals,
    RecordingsRead,
    RunRead,
)


def gate_revision(session: Session, gate_id: uuid.UUID, project_id: uuid.UUID) -> int:
    rev = session.scalar(
        select(Gate.revision).where(Gate.id == gate_id).where(Gate.project_id == project_id)
    )
    if rev is None:
        raise NotFound(f"no gate with id {gate_id}")
    return rev


def read_gate(
    session: Session,
    gate_id: uuid.UUID,
    project_id: uuid.UUID,
    *,
    public_url: str = "",
    cases_limit: int | None = None,
) -> GateRead:
    """``public_url``: GATE_PUBLIC_URL, which html_url is absolute under (a path when empty).
    ``cases_limit``: at most this many cases, the rest a page away (None: all of them)."""
    return read_gate_view(
        session, gate_id, project_id, public_url=public_url, cases_limit=cases_limit
    )[1]


def read_gate_body(
    session: Session,
    gate_id: uuid.UUID,
    project_id: uuid.UUID,
    *,
    public_url: str = "",
    cases_limit: int | None = None,
) -> tuple[int, bytes]:
    """The gate's revision and its JSON body (what GET answers), from five queries."""
    revision, view = read_gate_view(
        session, gate_id, project_id, public_url=public_url, cases_limit=cases_limit
    )
    return revision, view.model_dump_json().encode()


# GET /v1/gates/{id} answers this many cases by default (?cases_limit), the rest a page away
# (GET /v1/gates/{id}/cases): what a poll reads and serialises stays the same at 500 cases.
CASES_PAGE = 100
MAX_CASES_PAGE = 1000


def cases_path(gate_id: uuid.UUID, after: int, limit: int) -> str:
    """The REST path of the gate's cases after position ``after`` (a page's `next`)."""
    return f"/v1/gates/{gate_id}/cases?after={after}&limit={limit}"


def read_case_views(
    session: Session,
    gate_id: uuid.UUID,
    *,
    after: int = -1,
    limit: int | None = None,
    calls_by_case: Mapping[uuid.UUID, ModelCallTotals] | None = None,
) -> tuple[list[CaseRead], str | None]:
    """The gate's cases after position ``after`` in order, at most ``limit`` (None: all), and
    the path of the page after them (None when these are the last). Three queries, whatever
    the gate's size: a page costs what its own cases cost."""
    query = (
        select(Case).where(Case.gate_id == gate_id, Case.position > after).order_by(Case.position)
    )
    cases = list(session.scalars(query if limit is None else query.limit(limit + 1)).all())
    following = None
    if limit is not None and len(cases) > limit:
        cases = cases[:limit]
        # A body with no cases (cases_limit=0) points at the first page of the default size.
        following = cases_path(gate_id, cases[-1].position if cases else after, limit or CASES_PAGE)
    runs_by_case: dict[uuid.UUID, list[tuple[uuid.UUID, bool]]] = {c.id: [] for c in cases}
    if cases:
        rows = session.execute(
            select(Run.case_id, Run.id, Run.passed)
            .where(Run.case_id.in_([c.id for c in cases]))
            .order_by(Run.case_id, Run.index)
        ).all()
        for case_id, run_id, passed in rows:
            runs_by_case[case_id].append((run_id, passed))
    if calls_by_case is None:  # a page alone: its own cases' calls
        ids = [c.id for c in cases]
        calls_by_case = model_call_totals(session, gate_id, ids)[1] if cases else {}
    none = ModelCallTotals()
    views = [
        CaseRead(
            **carried(c, CaseRead)
            | {
                "agent_run_ids": [r for r, _ in runs_by_case[c.id]],
                "agent_run_passed": [p for _, p in runs_by_case[c.id]],
                "model_calls": calls_by_case.get(c.id, none),
            }
            | case_figures(c).answered()
        )
        for c in cases
    ]
    return views, following


def read_gate_view(
    session: Session,
    gate_id: uuid.UUID,
    project_id: uuid.UUID,
    *,
    public_url: str = "",
    cases_limit: int | None = None,
) -> tuple[int, GateRead]:
    """The gate's revision and its view, read in one go (the results page's ETag and body).

    With ``cases_limit``, the view holds the first cases only and ``next_cases`` the path of
    the rest: a poll of a 500-case gate then costs what a poll of a small one does. The
    counts are always the whole gate's.
    """
    # The gate and its bundle in one query, then the case counts, then a page of cases (see
    # read_case_views), then the model calls' totals.
    row = session.execute(
        select(Gate, Bundle)
        .join(Bundle, Bundle.sha256 == Gate.bundle_sha256)
        .where(Gate.id == gate_id)
        .where(Gate.project_id == project_id)
    ).first()
    if row is None:
        raise NotFound(f"no gate with id {gate_id}")
    gate, bundle = row
    total, passed, failed, judged = session.execute(
        select(
            func.count(),
            func.count().filter(Case.passed.is_(True)),
            func.count().filter(Case.status == CaseStatus.failed),
            func.count().filter(Case.status.not_in([CaseStatus.queued, CaseStatus.running])),
        ).where(Case.gate_id == gate.id)
    ).one()
    calls, calls_by_case = model_call_totals(session, gate.id)
    case_views, following = read_case_views(
        session, gate.id, limit=cases_limit, calls_by_case=calls_by_case
    )
    return gate.revision, GateRead(
        id=gate.id,
        status=gate.status,
        phase=gate.phase,
        created_at=gate.created_at,
        started_at=gate.started_at,
        finished_at=gate.finished_at,
        filter=gate.filter,
        model_mode=effective_model_mode(gate),
        requested_model_mode=gate.model_mode,
        model_modes=gate.model_modes or {},
        model_mode_reason=gate.model_mode_reason,
        labels=gate.labels,
        baseline=gate.baseline,
        baseline_gate_id=gate.baseline_gate_id,
        changed_only=gate.changed_only,
        sandbox=gate.sandbox,
        bundle=BundleRead.model_validate(bundle),
        total_cases=total,
        passed_cases=passed,
        failed_cases=failed,
        judged_cases=judged,
        error=gate.error,
        failure_reason=gate.failure_reason,
        problems=gate.problems,
        warnings=gate.warnings,
        model_calls=calls,
        cases=case_views,
        next_cases=following,
        html_url=gate_html_url(public_url, gate.id),
    )


def gate_recordings(session: Session, gate_id: uuid.UUID, project_id: uuid.UUID) -> RecordingsRead:
    """The gate's answered model calls as replay recordings; another project's gate is 404."""
    return read_recordings(session, get_gate(session, gate_id, project_id=project_id))


def list_gates(
    session: Session,
    *,
    project_id: uuid.UUID,
    status: str | None,
    label: dict[str, str] | None,
    limit: int,
    offset: int,
    public_url: str = "",
) -> GateList:
    stmt = select(Gate).where(Gate.project_id == project_id)
    if status:
        stmt = stmt.where(Gate.status == status)
    if label:
        stmt = stmt.where(Gate.labels.contains(label))
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    gates = session.scalars(stmt.order_by(Gate.created_at.desc()).limit(limit).offset(offset)).all()
    return GateList(
        items=[
            GateSummary.model_validate(g).model_copy(
                update={"html_url": gate_html_url(public_url, g.id)}
            )
            for g in gates
        ],
        total=total,
        limit=limit,
        offset=offset,
    )


def read_run(session: Session, run_id: uuid.UUID, project_id: uuid.UUID) -> RunRead:
    """The run as the API answers it: every shared value back in each place it stood, and
    what ran it (its gate's sandbox, read by the same query that checks the project)."""
    found = session.execute(
        select(Run, Gate.sandbox)
        .join(Case, Case.id == Run.case_id)
        .join(Gate, Gate.id == Case.gate_id)
        .where(Run.id == run_id)
        .where(Gate.project_id == project_id)
    ).first()
    if found is None:
        raise NotFound(f"no run with id {run_id}")
    run, sandbox = found
    return _run_view(run, sandbox)


def case_sandbox(session: Session, case: Case) -> dict[str, str] | None:
    """What ran the case's gate: {backend, runtime}; None before a worker started it."""
    sandbox: dict[str, str] | None = session.scalar(
        select(Gate.sandbox).where(Gate.id == case.gate_id)
    )
    return sandbox


def get_case(session: Session, case_id: uuid.UUID, project_id: uuid.UUID) -> Case:
    """The case; another project's is 404."""
    case = session.scalar(
        select(Case)
        .join(Gate, Gate.id == Case.gate_id)
        .where(Case.id == case_id)
        .where(Gate.project_id == project_id)
    )
    if case is None:
        raise NotFound(f"no case with id {case_id}")
    return case


def read_case_runs(session: Session, case: Case) -> list[RunRead]:
    """Every invocation of the case, in order, as read_run answers each."""
    runs = session.scalars(select(Run).where(Run.case_id == case.id).order_by(Run.index)).all()
    sandbox = case_sandbox(session, case)
    return [_run_view(run, sandbox) for run in runs]


def _run_view(run: Run, sandbox: dict[str, str] | None) -> RunRead:
    return RunRead(id=run.id, case_id=run.case_id, sandbox=sandbox, **read_back(run))


# The gate's model_mode before validating worked its agents' modes out (none forced).
PENDING_MODE = "pending"
# No LLM agent ran in any mode: the selected cases reach none, or the gate ended before its
# agents' modes were worked out.
NO_MODE = "none"
# LLM agents that ran in different modes.
MIXED_MODE = "mixed"


def effective_model_mode(gate: Gate) -> str:
    """The mode the gate's LLM agents ran in, never null: the forced one; else the one mode
    of every agent in ``model_modes``, or ``mixed``; else ``none`` once validating is over
    (a reason is stored) or the gate has ended, ``pending`` before."""
    if gate.model_mode:
        return gate.model_mode
    modes = set((gate.model_modes or {}).values())
    if len(modes) == 1:
        return modes.pop()
    if modes:
        return MIXED_MODE
    if gate.model_mode_reason is not None or GateStatus(gate.status).terminal:
        return NO_MODE
    return PENDING_MODE

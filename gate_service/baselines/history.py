"""A project's case history: ``GET /v1/projects/{name}/cases``.

Every case identity (``case_key``) the project's gates hold, a page at a time by suite, agent
and test name, each with its recent gates and its figures over its last ``gates`` judged
gates with its latest closure hash. Two statements whatever the page's size: the page of
identities (with its total and each one's active quarantine), then every row the page's
figures and recent gates need (at most twice ``gates`` per identity, picked by window
functions in Postgres). A third, a count, only for a page past the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, false, func, or_, select, true
from sqlalchemy import case as when
from sqlalchemy.orm import Session

from ..models import Case, CaseQuarantine, Gate, Project, utcnow
from .figures import JUDGED, RAN, interval_of
from .schemas import (
    CaseGateRead,
    CaseHistoryList,
    CaseHistoryRead,
    CaseIdentity,
    FlakyRead,
    IntervalRead,
    QuarantineRead,
)


def quarantine_read(project: Project, row: CaseQuarantine, now: datetime) -> QuarantineRead:
    """A quarantine row as the API answers it."""
    return QuarantineRead(
        id=row.id,
        project=project.name,
        case=CaseIdentity(suite=row.suite, agent_name=row.agent_name, test_name=row.test_name),
        case_key=row.case_key,
        owner=row.owner,
        reason=row.reason,
        expires_at=row.expires_at,
        active=row.expires_at > now,
        created_at=row.created_at,
        created_by=row.created_by,
    )


def case_history(
    session: Session,
    project: Project,
    *,
    gates: int,
    limit: int,
    offset: int,
    now: datetime | None = None,
) -> CaseHistoryList:
    """A page of the project's case identities with their history (see the module)."""
    now = now or utcnow()
    identities = (
        select(Case.case_key, Case.suite, Case.agent_name, Case.test_name)
        .join(Gate, Gate.id == Case.gate_id)
        .where(Gate.project_id == project.id, Case.case_key.is_not(None))
        .group_by(Case.case_key, Case.suite, Case.agent_name, Case.test_name)
        .subquery()
    )
    page = session.execute(
        select(identities, func.count().over().label("total"), CaseQuarantine)
        .select_from(identities)
        .outerjoin(
            CaseQuarantine,
            and_(
                CaseQuarantine.project_id == project.id,
                CaseQuarantine.case_key == identities.c.case_key,
                CaseQuarantine.expires_at > now,
            ),
        )
        .order_by(
            identities.c.suite,
            identities.c.agent_name,
            identities.c.test_name,
            identities.c.case_key,
        )
        .limit(limit)
        .offset(offset)
    ).all()
    if page:
        total = int(page[0].total)
    else:
        total = int(session.scalar(select(func.count()).select_from(identities)) or 0)
    keys = [row.case_key for row in page]
    rows = _recent_rows(session, project.id, keys, gates) if keys else {}
    items = [
        _history(
            row,
            rows.get(row.case_key, []),
            gates,
            quarantine_read(project, row.CaseQuarantine, now) if row.CaseQuarantine else None,
        )
        for row in page
    ]
    return CaseHistoryList(
        project=project.name,
        history_gates=gates,
        items=items,
        total=total,
        limit=limit,
        offset=offset,
    )


def _recent_rows(
    session: Session, project_id: uuid.UUID, keys: Sequence[str], gates: int
) -> dict[str, list[Any]]:
    """Each key's rows, newest first: its last ``gates`` cases whatever their closure, and its
    last ``gates`` counted cases (judged, not reused) with its latest closure hash.

    The latest closure hash is that of the newest counted case, else of the newest case.
    """
    counted = when(
        (and_(Case.status.in_(JUDGED), Case.reused_from.is_(None)), true()), else_=false()
    )
    newest = (Gate.created_at.desc(), Gate.id.desc())
    ranked = (
        select(
            Case.case_key,
            Case.id.label("case_id"),
            Case.gate_id,
            Gate.created_at,
            Gate.status.label("gate_status"),
            Case.status,
            Case.successes,
            RAN.label("ran"),
            Case.success_threshold,
            Case.closure_hash,
            Case.stopped_early,
            Case.reused_from,
            Case.flaky,
            counted.label("counted"),
            func.row_number().over(partition_by=Case.case_key, order_by=newest).label("rank_all"),
            func.row_number()
            .over(partition_by=(Case.case_key, Case.closure_hash, counted), order_by=newest)
            .label("rank_closure"),
            func.first_value(Case.closure_hash)
            .over(partition_by=Case.case_key, order_by=(counted.desc(), *newest))
            .label("latest_closure"),
        )
        .join(Gate, Gate.id == Case.gate_id)
        .where(Gate.project_id == project_id, Case.case_key.in_(keys))
        .subquery()
    )
    picked = session.execute(
        select(ranked)
        .where(
            or_(
                ranked.c.rank_all <= gates,
                and_(
                    ranked.c.counted.is_(True),
                    ranked.c.rank_closure <= gates,
                    ranked.c.closure_hash.is_not_distinct_from(ranked.c.latest_closure),
                ),
            )
        )
        .order_by(ranked.c.case_key, ranked.c.rank_all)
    ).all()
    found: dict[str, list[Any]] = {}
    for row in picked:
        found.setdefault(row.case_key, []).append(row)
    return found


def _history(
    identity: Any, rows: Sequence[Any], gates: int, quarantine: QuarantineRead | None
) -> CaseHistoryRead:
    latest = rows[0].latest_closure if rows else None
    counted = [
        r for r in rows if r.counted and r.rank_closure <= gates and r.closure_hash == latest
    ]
    successes = sum(r.successes for r in counted)
    runs = sum(r.ran for r in counted)
    interval = interval_of(successes, runs)
    threshold = rows[0].success_threshold if rows else 0
    flaky = counted[0].flaky if counted else None
    return CaseHistoryRead(
        case_key=identity.case_key,
        suite=identity.suite,
        agent_name=identity.agent_name,
        test_name=identity.test_name,
        closure_hash=latest,
        success_threshold=threshold,
        gates=len(counted),
        passed_gates=sum(1 for r in counted if r.status == "passed"),
        successes=successes,
        runs=runs,
        pass_rate=round(100 * successes / runs, 2) if runs > 0 else None,
        interval=IntervalRead(low=interval.low, high=interval.high) if interval else None,
        narrow=interval is not None and interval.holds(threshold),
        flaky=FlakyRead.model_validate(flaky) if flaky else None,
        quarantine=quarantine,
        recent=[_gate_row(r) for r in rows if r.rank_all <= gates],
    )


def one_case_history(
    session: Session, project_id: uuid.UUID, case_key: str, gates: int
) -> list[CaseGateRead]:
    """One case's last ``gates`` gates, oldest first (its page's history), each row as
    ``GET /v1/projects/{name}/cases`` answers it; the same query, for one key."""
    rows = _recent_rows(session, project_id, [case_key], gates).get(case_key, [])
    return [_gate_row(r) for r in reversed(rows) if r.rank_all <= gates]


def _gate_row(r: Any) -> CaseGateRead:
    """One of ``_recent_rows``'s rows as the answer's row."""
    return CaseGateRead(
        gate_id=r.gate_id,
        case_id=r.case_id,
        created_at=r.created_at,
        gate_status=r.gate_status,
        status=r.status,
        successes=r.successes,
        runs=r.ran,
        closure_hash=r.closure_hash,
        stopped_early=r.stopped_early,
        reused=r.reused_from is not None,
    )

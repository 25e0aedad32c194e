"""Quarantines: the admin writes and reads ``routes`` serves, each write with its audit event.
Functions take the session and never commit.

A quarantined case still runs and is reported, but until ``expires_at`` its failure (or
regression) does not fail a gate (``judging.annotate_cases`` copies the quarantine that holds
onto the case, ``gates.lifecycle.finish_gate`` reads it). This module is the only writer of
``case_quarantines``, reached only through the admin API: nothing a bundle holds or a case
reports names a quarantine. A quarantine needs its end, at most GATE_MAX_QUARANTINE_DAYS
ahead, and ends by itself then (every read compares ``expires_at`` with the time; its setting
and any early clearing are audited, and its end is in the setting's event).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ..auth.service import Principal, record_in, visible_project
from ..errors import Conflict, NotFound, RequestInvalid
from ..models import Case, CaseQuarantine, Gate, Project, utcnow
from .closure import case_key
from .history import quarantine_read
from .schemas import QuarantineList, QuarantinePut, QuarantineRead

# The list shows the quarantines that ended this recently beside those that hold.
RECENTLY_EXPIRED = timedelta(days=30)
# At most this many quarantines of a project hold at once.
MAX_ACTIVE_QUARANTINES = 1000


def _invalid(location: str, message: str) -> RequestInvalid:
    return RequestInvalid(
        f"{location}: {message}", problems=[{"location": location, "message": message}]
    )


def _identity(row: CaseQuarantine) -> dict[str, str]:
    return {"suite": row.suite, "agent_name": row.agent_name, "test_name": row.test_name}


def set_quarantine(
    session: Session,
    who: Principal,
    name: str,
    body: QuarantinePut,
    *,
    max_days: int,
    now: datetime | None = None,
) -> tuple[QuarantineRead, bool]:
    """Quarantine a case of the project until ``body.expires_at``, replacing the quarantine
    it had (held or ended); (the quarantine, whether it is new). Audited as
    ``case.quarantined`` (with what it replaced).

    RequestInvalid for an end not ahead or more than ``max_days`` ahead, or a case the
    project's gates never held; Conflict past MAX_ACTIVE_QUARANTINES.
    """
    now = now or utcnow()
    project = visible_project(session, who, name)
    expires_at = body.expires_at
    if expires_at <= now:
        raise _invalid(
            "body.expires_at",
            f"{expires_at.isoformat()} is not in the future (it is {now.isoformat()} now); "
            "a quarantine ends by itself, so its end must lie ahead",
        )
    if expires_at > now + timedelta(days=max_days):
        raise _invalid(
            "body.expires_at",
            f"{expires_at.isoformat()} is more than {max_days} days ahead "
            "(GATE_MAX_QUARANTINE_DAYS); quarantine for less and set it again when it ends",
        )
    identity = body.case
    key = case_key(identity.suite, identity.agent_name, identity.test_name)
    known = session.scalar(
        select(Case.id)
        .join(Gate, Gate.id == Case.gate_id)
        .where(Gate.project_id == project.id, Case.case_key == key)
        .limit(1)
    )
    if known is None:
        raise _invalid(
            "body.case",
            f"no gate of project {project.name!r} holds the case {identity.agent_name}::"
            f"{identity.test_name} of {identity.suite} (GET /v1/projects/{project.name}/cases "
            "lists its cases as they are named)",
        )
    before = session.scalar(
        select(CaseQuarantine)
        .where(CaseQuarantine.project_id == project.id, CaseQuarantine.case_key == key)
        .with_for_update()
    )
    if before is None or before.expires_at <= now:
        holding = session.scalar(
            select(func.count())
            .select_from(CaseQuarantine)
            .where(CaseQuarantine.project_id == project.id, CaseQuarantine.expires_at > now)
        )
        if (holding or 0) >= MAX_ACTIVE_QUARANTINES:
            raise Conflict(
                f"project {project.name!r} has {holding} quarantines that hold; the limit is "
                f"{MAX_ACTIVE_QUARANTINES}: clear some first"
            )
    replaced: dict[str, Any] | None = None
    if before is not None:
        replaced = {
            "id": str(before.id),
            "owner": before.owner,
            "reason": before.reason,
            "expires_at": before.expires_at.isoformat(),
        }
    values = {
        "suite": identity.suite,
        "agent_name": identity.agent_name,
        "test_name": identity.test_name,
        "owner": body.owner,
        "reason": body.reason,
        "expires_at": expires_at,
        "created_at": now,
        "created_by": who.token_id,
    }
    # One statement whether or not a row is there: two admins setting the same case at once
    # both succeed, the later one's values kept, and neither answers a unique violation.
    statement = insert(CaseQuarantine).values(
        id=uuid.uuid4(), project_id=project.id, case_key=key, **values
    )
    quarantine_id = session.scalar(
        statement.on_conflict_do_update(
            index_elements=["project_id", "case_key"], set_=values
        ).returning(CaseQuarantine.id)
    )
    row = session.scalars(
        select(CaseQuarantine)
        .where(CaseQuarantine.id == quarantine_id)
        .execution_options(populate_existing=True)
    ).one()
    record_in(
        session,
        who,
        project,
        "case.quarantined",
        quarantine=str(row.id),
        case=_identity(row),
        owner=row.owner,
        reason=row.reason,
        expires_at=row.expires_at.isoformat(),
        replaced=replaced,
    )
    return quarantine_read(project, row, now), before is None


def list_quarantines(
    session: Session,
    who: Principal,
    name: str,
    *,
    limit: int,
    offset: int,
    now: datetime | None = None,
) -> QuarantineList:
    """The project's quarantines that hold, then those that ended within RECENTLY_EXPIRED;
    each kind soonest to end first (the ended: most recently ended first)."""
    now = now or utcnow()
    project = visible_project(session, who, name)
    shown = select(CaseQuarantine).where(
        CaseQuarantine.project_id == project.id,
        CaseQuarantine.expires_at > now - RECENTLY_EXPIRED,
    )
    total = session.scalar(select(func.count()).select_from(shown.subquery())) or 0
    holding = CaseQuarantine.expires_at > now
    rows = session.scalars(
        shown.order_by(
            holding.desc(),
            # ahead: soonest first; ended: most recent first
            func.abs(func.extract("epoch", CaseQuarantine.expires_at - now)),
            CaseQuarantine.id,
        )
        .limit(limit)
        .offset(offset)
    ).all()
    return QuarantineList(
        project=project.name,
        items=[quarantine_read(project, row, now) for row in rows],
        total=total,
        limit=limit,
        offset=offset,
    )


def clear_quarantine(
    session: Session,
    who: Principal,
    name: str,
    quarantine_id: uuid.UUID,
    *,
    now: datetime | None = None,
) -> QuarantineRead:
    """Remove a quarantine (held or ended) at once; audited as ``case.quarantine_cleared``.
    Another project's, or one that is not there, is NotFound."""
    now = now or utcnow()
    project = visible_project(session, who, name)
    row = _own(session, project, quarantine_id)
    answer = quarantine_read(project, row, now)
    session.delete(row)
    record_in(
        session,
        who,
        project,
        "case.quarantine_cleared",
        quarantine=str(row.id),
        case=_identity(row),
        owner=row.owner,
        expires_at=row.expires_at.isoformat(),
        was_active=answer.active,
    )
    return answer


def _own(session: Session, project: Project, quarantine_id: uuid.UUID) -> CaseQuarantine:
    row = session.scalar(
        select(CaseQuarantine).where(
            CaseQuarantine.id == quarantine_id, CaseQuarantine.project_id == project.id
        )
    )
    if row is None:
        raise NotFound(f"no quarantine with id {quarantine_id} in project {project.name!r}")
    return row

"""HTTP routes of baselines: a project's case history (read scope) and its quarantines (admin
scope). Thin: the reads are ``history``'s, the writes ``quarantine``'s."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from ..auth.deps import ADMIN_ERRORS, Admin, Reader
from ..auth.service import visible_project
from ..deps import SessionDep, SettingsDep
from ..errors import error_responses
from . import history, quarantine
from .schemas import CaseHistoryList, QuarantineList, QuarantinePut, QuarantineRead

router = APIRouter(prefix="/v1", tags=["baselines"])

READ_ERRORS = error_responses(
    {
        400: "Bad request (or a Host not in GATE_TRUSTED_HOSTS)",
        401: "No token, or an unknown, expired or revoked one",
        403: "The token lacks the read scope",
        404: "Not found (or another project's)",
        422: "Invalid request",
        429: "Too many failed authentications",
    }
)
Limit = Annotated[int, Query(ge=1, le=200)]
Offset = Annotated[int, Query(ge=0, le=1_000_000)]


@router.get("/projects/{name}/cases", response_model=CaseHistoryList, responses=READ_ERRORS)
def case_history(
    name: str,
    session: SessionDep,
    settings: SettingsDep,
    who: Reader,
    limit: Limit = 50,
    offset: Offset = 0,
) -> CaseHistoryList:
    """Every case identity of the project (suite, agent, test name), by those names, with its
    last GATE_HISTORY_GATES gates and, over its last GATE_HISTORY_GATES judged gates with its
    latest closure hash: successes, runs, pass rate, Wilson 95% interval, flakiness, and its
    quarantine while one holds."""
    project = visible_project(session, who, name)
    return history.case_history(
        session, project, gates=settings.history_gates, limit=limit, offset=offset
    )


@router.post(
    "/projects/{name}/quarantine",
    status_code=201,
    response_model=QuarantineRead,
    responses={
        200: {"model": QuarantineRead, "description": "The case's quarantine was replaced"},
        **ADMIN_ERRORS,
    },
)
def set_quarantine(
    name: str,
    body: QuarantinePut,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    who: Admin,
) -> QuarantineRead:
    """Quarantine a case until `expires_at` (at most GATE_MAX_QUARANTINE_DAYS ahead): it still
    runs and is reported, but its failure or regression does not fail a gate that judges it
    meanwhile. Replaces the case's quarantine if it had one (200; new: 201). Audited as
    `case.quarantined`. Admin scope; nothing in a bundle can set one."""
    answer, created = quarantine.set_quarantine(
        session, who, name, body, max_days=settings.max_quarantine_days
    )
    if not created:
        response.status_code = 200
    return answer


@router.get("/projects/{name}/quarantine", response_model=QuarantineList, responses=ADMIN_ERRORS)
def list_quarantines(
    name: str, session: SessionDep, who: Admin, limit: Limit = 100, offset: Offset = 0
) -> QuarantineList:
    """The project's quarantines that hold, then those that ended in the last 30 days."""
    return quarantine.list_quarantines(session, who, name, limit=limit, offset=offset)


@router.delete(
    "/projects/{name}/quarantine/{quarantine_id}",
    response_model=QuarantineRead,
    responses=ADMIN_ERRORS,
)
def clear_quarantine(
    name: str, quarantine_id: uuid.UUID, session: SessionDep, who: Admin
) -> QuarantineRead:
    """End a quarantine now (held or already ended): the case's failures fail gates that
    judge it from now on. Answers what was removed; audited as `case.quarantine_cleared`."""
    return quarantine.clear_quarantine(session, who, name, quarantine_id)

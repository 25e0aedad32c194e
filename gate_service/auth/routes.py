"""Admin routes: projects, their tokens, and the audit trail."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from ..deps import SessionDep
from ..errors import Forbidden
from ..models import AuditEvent
from . import service
from .deps import Admin
from .schemas import (
    AuditList,
    AuditRead,
    ProjectCreate,
    ProjectRead,
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenRead,
)

router = APIRouter(prefix="/v1", tags=["admin"])
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "Bad request"},
    401: {"description": "No token, or an unknown, expired or revoked one"},
    403: {"description": "The token lacks the admin scope"},
    404: {"description": "Not found (or another project's)"},
    409: {"description": "Conflict"},
    429: {"description": "Too many failed authentications"},
}


@router.post("/projects", status_code=201, response_model=ProjectRead, responses=ERRORS)
def create_project(body: ProjectCreate, session: SessionDep, who: Admin) -> ProjectRead:
    """Create a project (admin tokens of the `default` project only)."""
    if not who.service_admin:
        raise Forbidden("only admin tokens of the 'default' project create projects")
    project = service.create_project(session, body.name, body.retention_days)
    service.record_by(session, who, "project.created", project=project.name)
    return ProjectRead.model_validate(project)


@router.post(
    "/projects/{name}/tokens", status_code=201, response_model=TokenCreated, responses=ERRORS
)
def create_token(name: str, body: TokenCreate, session: SessionDep, who: Admin) -> TokenCreated:
    """Issue a token of the project; its value is in this answer and nowhere else."""
    project = service.visible_project(session, who, name)
    row, token = service.issue_token(
        session, project, body.scopes, expires_in_days=body.expires_in_days, name=body.name
    )
    service.record(
        session,
        "token.created",
        project_id=project.id,
        token_id=who.token_id,
        detail={"token": str(row.id), "scopes": row.scopes},
    )
    return TokenCreated(
        **TokenRead.model_validate(row).model_dump(), project=project.name, token=token
    )


@router.get("/projects/{name}/tokens", response_model=TokenList, responses=ERRORS)
def list_tokens(name: str, session: SessionDep, who: Admin) -> TokenList:
    """The project's tokens, without their values."""
    project = service.visible_project(session, who, name)
    return TokenList(
        items=[TokenRead.model_validate(t) for t in service.project_tokens(session, project)]
    )


@router.delete("/tokens/{token_id}", response_model=TokenRead, responses=ERRORS)
def revoke_token(token_id: uuid.UUID, session: SessionDep, who: Admin) -> TokenRead:
    """Revoke a token at once; it answers 401 from now on."""
    token = service.revoke_token(session, who, token_id)
    service.record(
        session,
        "token.revoked",
        project_id=token.project_id,
        token_id=who.token_id,
        detail={"token": str(token.id)},
    )
    return TokenRead.model_validate(token)


@router.get("/audit", response_model=AuditList, responses=ERRORS)
def audit(
    session: SessionDep,
    who: Admin,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> AuditList:
    """Recorded events, newest first: the project's own, or every project's for `default`."""
    stmt = select(AuditEvent)
    if not who.service_admin:
        stmt = stmt.where(AuditEvent.project_id == who.project_id)
    rows = session.scalars(stmt.order_by(AuditEvent.id.desc()).limit(limit).offset(offset)).all()
    return AuditList(items=[AuditRead.model_validate(r) for r in rows], limit=limit, offset=offset)

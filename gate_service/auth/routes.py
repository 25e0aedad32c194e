"""Admin routes: project tokens and the audit trail; and whoami, which any token may ask."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from ..deps import SessionDep
from ..errors import Forbidden, RequestInvalid, Unauthorized, error_responses
from ..models import ApiToken, AuditEvent
from . import service
from .deps import ADMIN_ERRORS as ERRORS
from .deps import Admin, Caller
from .schemas import (
    AuditList,
    AuditRead,
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenRead,
    WhoAmI,
)
from .tokens import Scope

router = APIRouter(prefix="/v1", tags=["admin"])
AUDIT_ACTION = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*", re.ASCII)
WHOAMI_ERRORS = error_responses(
    {
        400: "Bad request (or a Host not in GATE_TRUSTED_HOSTS)",
        401: "No token, or an unknown, expired or revoked one",
        403: "The token lacks the scope ?scope= names",
        422: "Invalid request (?scope= is not a scope)",
        429: "Too many failed authentications",
    }
)


@router.get("/whoami", response_model=WhoAmI, responses=WHOAMI_ERRORS, tags=["auth"])
def whoami(
    session: SessionDep,
    who: Caller,
    scope: Annotated[
        Scope | None,
        Query(description="Answer 403 unless the token holds this scope (admin holds all)"),
    ] = None,
) -> WhoAmI:
    """The calling token (any scope): its project, id, name, scopes and expiry, never its
    value. With `?scope=`, `403` unless it holds that scope: a client checks its token with
    this before packing and uploading (`gate submit` asks `?scope=submit`)."""
    if scope is not None and not who.has(scope):
        scopes = sorted(who.scopes)
        raise Forbidden(
            f"this token of project {who.project_name!r} holds the scope(s) "
            f"{', '.join(scopes) or 'none'}; it lacks the {scope} scope",
            problems=[
                {
                    "location": "token",
                    "project": who.project_name,
                    "scopes": scopes,
                    "needed": str(scope),
                }
            ],
        )
    token = session.get(ApiToken, who.token_id)
    if token is None:  # deleted (with its project) since it was judged a moment ago
        raise Unauthorized(service.REFUSAL_TEXT["unknown"])
    return WhoAmI(project=who.project_name, token=TokenRead.model_validate(token))


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
    action: Annotated[
        list[str] | None,
        Query(max_length=20, description="Only these actions, e.g. token.rejected (repeatable)"),
    ] = None,
    since: Annotated[
        datetime | None,
        Query(description="Only events at or after this ISO 8601 time (UTC if no offset)"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> AuditList:
    """Recorded events, newest first: the project's own, or every project's for `default`."""
    stmt = select(AuditEvent)
    if not who.service_admin:
        stmt = stmt.where(AuditEvent.project_id == who.project_id)
    if action:
        bad = [a for a in action if len(a) > 64 or not AUDIT_ACTION.fullmatch(a)]
        if bad:
            raise RequestInvalid(
                f"action must be an audit action such as token.rejected, got {bad[0]!r}",
                problems=[{"location": "query.action", "message": "not an audit action"}],
            )
        stmt = stmt.where(AuditEvent.action.in_(action))
    if since is not None:
        stmt = stmt.where(AuditEvent.at >= (since if since.tzinfo else since.replace(tzinfo=UTC)))
    rows = session.scalars(stmt.order_by(AuditEvent.id.desc()).limit(limit).offset(offset)).all()
    return AuditList(items=[AuditRead.model_validate(r) for r in rows], limit=limit, offset=offset)

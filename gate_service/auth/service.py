"""Tokens, the caller they make, the audit trail, and which projects a caller may see.
Functions take the session and never commit."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from ..errors import NotFound
from ..models import DEFAULT_PROJECT, ApiToken, AuditEvent, Project, utcnow
from .tokens import Scope, digests_match, new_token, token_digest

# The names a project may have: here, not in projects/, because visible_project looks no
# other name up, and auth imports nothing of projects (which creates them by this rule).
PROJECT_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# last_used_at is written at most this often per token, so reads stay reads.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class Principal:
    """Who is calling: one token of one project, with its scopes."""

    token_id: uuid.UUID
    project_id: uuid.UUID
    project_name: str
    scopes: frozenset[str]

    def has(self, scope: Scope) -> bool:
        return scope in self.scopes or Scope.admin in self.scopes

    @property
    def service_admin(self) -> bool:
        """Admin tokens of the bootstrap project administer every project."""
        return Scope.admin in self.scopes and self.project_name == DEFAULT_PROJECT


def token_refusal(
    revoked_at: datetime | None, expires_at: datetime | None, now: datetime
) -> str | None:
    """Why a known token is refused ("revoked", "expired"), or None: the one owner of the rule.

    The status-read fast path (gates/routes.py) asks this too, so a new rule lands in both.
    """
    if revoked_at is not None:
        return "revoked"
    if expires_at is not None and expires_at <= now:
        return "expired"
    return None


def last_use_due(last_used_at: datetime | None, now: datetime) -> bool:
    """Whether authenticating now must write the token's last_used_at."""
    return last_used_at is None or now - last_used_at > LAST_USED_RESOLUTION


REFUSAL_TEXT = {
    "unknown": "the token is not known",
    "revoked": "the token was revoked",
    "expired": "the token has expired",
}


@dataclass(frozen=True)
class Refused:
    """Why a token was refused: ``why`` is unknown, revoked or expired (the audit's word)."""

    why: str
    project_id: uuid.UUID | None = None  # a known token's project and id
    token_id: uuid.UUID | None = None

    @property
    def text(self) -> str:
        return REFUSAL_TEXT[self.why]


def authenticate(session: Session, token: str) -> Principal | Refused:
    """The token's principal, or why it is refused (the caller answers 401 and audits)."""
    digest = token_digest(token)
    row = session.execute(
        select(ApiToken, Project.name)
        .join(Project, Project.id == ApiToken.project_id)
        .where(ApiToken.token_sha256 == digest)
    ).first()
    if row is None or not digests_match(row[0].token_sha256, digest):
        return Refused("unknown")
    stored, project_name = row
    now = utcnow()
    why = token_refusal(stored.revoked_at, stored.expires_at, now)
    if why is not None:
        return Refused(why, stored.project_id, stored.id)
    if last_use_due(stored.last_used_at, now):
        # A statement, not a flush: a token deleted meanwhile (with its project, whose
        # transaction held the row) updates no row and is unknown now, not a failed flush.
        written = session.execute(
            update(ApiToken)
            .where(ApiToken.id == stored.id)
            .values(last_used_at=now)
            .execution_options(synchronize_session=False)
        )
        if not cast(CursorResult[Any], written).rowcount:
            return Refused("unknown")
    return Principal(stored.id, stored.project_id, project_name, frozenset(stored.scopes))


def record(
    session: Session,
    action: str,
    *,
    project_id: uuid.UUID | None,
    token_id: uuid.UUID | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    session.add(
        AuditEvent(
            at=utcnow(),
            project_id=project_id,
            token_id=token_id,
            action=action,
            detail=detail or {},
        )
    )


def record_by(session: Session, who: Principal, action: str, **detail: Any) -> None:
    record(session, action, project_id=who.project_id, token_id=who.token_id, detail=detail)


def record_in(
    session: Session, who: Principal, project: Project, action: str, **detail: Any
) -> None:
    """An event of ``project``'s own (where its admins read it), by the acting token: an
    admin of `default` acting on another project included."""
    session.flush()
    record(
        session,
        action,
        project_id=project.id,
        token_id=who.token_id,
        detail={"project": project.name, **detail},
    )


def visible_project(session: Session, who: Principal, name: str) -> Project:
    """A project the caller administers; any other answers 404, as if it did not exist."""
    # A name no project can have (NUL, a surrogate, a slash...) is not looked up at all.
    project = (
        session.scalar(select(Project).where(Project.name == name))
        if PROJECT_NAME.fullmatch(name)
        else None
    )
    if project is None or not (who.service_admin or project.id == who.project_id):
        raise NotFound(f"no project named {name!r}")
    return project


def issue_token(
    session: Session,
    project: Project,
    scopes: list[Scope],
    *,
    expires_in_days: int | None = None,
    name: str | None = None,
    token: str | None = None,
) -> tuple[ApiToken, str]:
    """A new token of ``project``; the token itself is returned here and never again."""
    token = token or new_token()
    now = utcnow()
    row = ApiToken(
        project_id=project.id,
        name=name,
        token_sha256=token_digest(token),
        scopes=sorted({str(s) for s in scopes}),
        created_at=now,
        expires_at=now + timedelta(days=expires_in_days) if expires_in_days else None,
    )
    session.add(row)
    session.flush()
    return row, token


def project_tokens(session: Session, project: Project) -> list[ApiToken]:
    return list(
        session.scalars(
            select(ApiToken).where(ApiToken.project_id == project.id).order_by(ApiToken.created_at)
        )
    )


def revoke_token(session: Session, who: Principal, token_id: uuid.UUID) -> ApiToken:
    token = session.get(ApiToken, token_id)
    if token is None or not (who.service_admin or token.project_id == who.project_id):
        raise NotFound(f"no token with id {token_id}")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
    return token

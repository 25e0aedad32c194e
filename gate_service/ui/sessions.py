"""Sign-ins to the results pages: server-side sessions, each one token's.

The cookie holds a random id and nothing else; the table keeps only its SHA-256, so neither a
stolen database row nor the cookie tells a token. A session ends when it expires, at sign-out,
or as soon as its token is revoked or expires (checked on every page). Functions take the
session and never commit.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ..auth.service import Principal, token_refusal
from ..auth.tokens import Scope, token_digest
from ..models import ApiToken, Project, UiSession, utcnow

COOKIE = "gate_session"


@dataclass(frozen=True)
class SignedIn:
    """A page's caller: the token's principal, and the form token its forms carry."""

    who: Principal
    csrf: str
    session_digest: str


def csrf_token(cookie: str) -> str:
    """The session's form token: derived from the cookie, which another site can neither
    read (HttpOnly) nor send (SameSite=Strict), so a forged form cannot know it."""
    return hmac.new(cookie.encode(), b"gate-ui-form", hashlib.sha256).hexdigest()


def csrf_matches(cookie: str, given: str) -> bool:
    return hmac.compare_digest(csrf_token(cookie).encode(), given.encode("utf-8", "replace"))


def open_session(session: Session, who: Principal, *, hours: float) -> tuple[str, datetime]:
    """A new session for ``who``: the cookie's value and when it expires (no later than the
    token does). Expired sessions of every token are swept on the way."""
    now = utcnow()
    token = session.get(ApiToken, who.token_id)
    expires = now + timedelta(hours=hours)
    if token is not None and token.expires_at is not None:
        expires = min(expires, token.expires_at)
    cookie = secrets.token_urlsafe(32)
    session.execute(delete(UiSession).where(UiSession.expires_at <= now))
    session.add(
        UiSession(
            id_sha256=token_digest(cookie),
            token_id=who.token_id,
            created_at=now,
            expires_at=expires,
        )
    )
    return cookie, expires


def signed_in(session: Session, cookie: str | None) -> SignedIn | None:
    """The caller of a session cookie, or None: unknown, expired, or its token revoked,
    expired or without the read scope."""
    if not cookie or len(cookie) > 100:
        return None
    digest = token_digest(cookie)
    row = session.execute(
        select(UiSession.expires_at, ApiToken, Project.name)
        .join(ApiToken, ApiToken.id == UiSession.token_id)
        .join(Project, Project.id == ApiToken.project_id)
        .where(UiSession.id_sha256 == digest)
    ).first()
    if row is None:
        return None
    expires_at, token, project_name = row
    now = utcnow()
    if expires_at <= now or token_refusal(token.revoked_at, token.expires_at, now):
        return None
    who = Principal(token.id, token.project_id, project_name, frozenset(token.scopes))
    if not who.has(Scope.read):
        return None
    return SignedIn(who, csrf_token(cookie), digest)


def close_session(session: Session, cookie: str | None) -> None:
    if cookie:
        session.execute(delete(UiSession).where(UiSession.id_sha256 == token_digest(cookie)))

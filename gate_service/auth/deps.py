"""The bearer-token dependency every /v1 route uses, and its brake on guessing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from ..app_state import state_of
from ..db import session_scope
from ..errors import Forbidden, TooManyRequests, Unauthorized, error_responses
from .brakes import AuditBudget, FailureLimiter
from .service import Principal, Refused, authenticate, record
from .tokens import Scope

# The error answers of the admin routes (auth's tokens and audit, projects' settings), in
# their OpenAPI: one declaration, so the two routers document the same statuses alike.
ADMIN_ERRORS = error_responses(
    {
        400: "Bad request (or a Host not in GATE_TRUSTED_HOSTS)",
        401: "No token, or an unknown, expired or revoked one",
        403: "The token lacks the admin scope",
        404: "Not found (or another project's)",
        409: "Conflict",
        422: "Invalid request",
        429: "Too many failed authentications",
    }
)


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None when there is none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def client_address(request: Request) -> str:
    """The address the failure brake counts by."""
    return request.client.host if request.client else "unknown"


def principal(request: Request) -> Principal:
    return check_token(
        request,
        bearer_token(request),
        missing="this route needs an 'Authorization: Bearer <token>' header",
    )


def check_token(request: Request, token: str | None, *, missing: str) -> Principal:
    """The principal of ``token`` (a bearer header's, or the results pages' sign-in form's),
    behind the brake on guessing: the one place a presented token is judged and audited."""
    state = state_of(request)
    limiter = state.part(FailureLimiter)
    client = client_address(request)
    wait = limiter.retry_after(client)
    if wait is not None:
        raise TooManyRequests(
            f"too many failed authentications from {client}; try again in {wait} s",
            retry_after_s=wait,
        )
    if token is None:
        limiter.failed(client)
        raise Unauthorized(missing)
    with session_scope(state.sessions) as session:
        who = authenticate(session, token)
        if isinstance(who, Refused):
            suppressed = state.part(AuditBudget).take()
            if suppressed is not None:
                detail: dict[str, object] = {"why": who.why}
                if suppressed:
                    detail["suppressed"] = suppressed
                record(
                    session,
                    "token.rejected",
                    project_id=who.project_id,
                    token_id=who.token_id,
                    detail=detail,
                )
    if isinstance(who, Refused):
        limiter.failed(client)
        raise Unauthorized(who.text)
    return who


def require(scope: Scope) -> Callable[[Request], Principal]:
    """A dependency: the caller's principal, which must hold ``scope`` (admin holds all)."""

    def check(request: Request) -> Principal:
        who = principal(request)
        if not who.has(scope):
            raise Forbidden(f"this token of project {who.project_name!r} lacks the {scope} scope")
        return who

    return check


Caller = Annotated[Principal, Depends(principal)]  # any valid token, whatever its scopes
Reader = Annotated[Principal, Depends(require(Scope.read))]
Submitter = Annotated[Principal, Depends(require(Scope.submit))]
Admin = Annotated[Principal, Depends(require(Scope.admin))]

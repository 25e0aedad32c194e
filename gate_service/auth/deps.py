"""The bearer-token dependency every /v1 route uses, and its brake on guessing."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from ..db import session_scope
from ..deps import get_sessionmaker
from ..errors import Forbidden, TooManyRequests, Unauthorized
from .service import Principal, Refused, authenticate, record
from .tokens import Scope


class FailureLimiter:
    """Counts failed authentications per client; past the limit the client waits (429).

    In memory, per API process: enough to make guessing a 256-bit token pointless and to keep
    a flood of bad tokens from writing an audit row each.
    """

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit, self.window_s = limit, window_s
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        failures = self._failures.setdefault(client, deque())
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        return failures

    def retry_after(self, client: str) -> int | None:
        """Seconds the client must wait, or None when it may try."""
        now = time.monotonic()
        with self._lock:
            failures = self._recent(client, now)
            if len(failures) < self.limit:
                if not failures:
                    self._failures.pop(client, None)
                return None
            return max(1, math.ceil(failures[0] + self.window_s - now))

    def failed(self, client: str) -> None:
        with self._lock:
            self._recent(client, time.monotonic()).append(time.monotonic())


class AuditBudget:
    """Audit rows for refused tokens, at most ``limit`` per window in this process.

    The failure brake bounds each client address, not how many addresses there are (a
    botnet, or a proxy's forwarded addresses): past the budget a refusal is counted, not
    written, and the next row written says how many were left out (``suppressed``).
    """

    def __init__(
        self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self._written: deque[float] = deque()
        self._suppressed = 0
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """None: write no row; else write one, saying this many before it were left out."""
        now = self.clock()
        with self._lock:
            while self._written and self._written[0] <= now - self.window_s:
                self._written.popleft()
            if len(self._written) >= self.limit:
                self._suppressed += 1
                return None
            self._written.append(now)
            suppressed, self._suppressed = self._suppressed, 0
            return suppressed


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None when there is none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def client_address(request: Request) -> str:
    """The address the failure brake counts by."""
    return request.client.host if request.client else "unknown"


def principal(request: Request) -> Principal:
    limiter: FailureLimiter = request.app.state.auth_failures
    client = client_address(request)
    wait = limiter.retry_after(client)
    if wait is not None:
        raise TooManyRequests(
            f"too many failed authentications from {client}; try again in {wait} s",
            retry_after_s=wait,
        )
    token = bearer_token(request)
    if token is None:
        limiter.failed(client)
        raise Unauthorized("this route needs an 'Authorization: Bearer <token>' header")
    with session_scope(get_sessionmaker(request)) as session:
        who = authenticate(session, token)
        if isinstance(who, Refused):
            audits: AuditBudget = request.app.state.auth_failure_audits
            suppressed = audits.take()
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


Reader = Annotated[Principal, Depends(require(Scope.read))]
Submitter = Annotated[Principal, Depends(require(Scope.submit))]
Admin = Annotated[Principal, Depends(require(Scope.admin))]

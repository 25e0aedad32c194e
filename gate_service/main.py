"""The FastAPI application: built by create_app, with engines made in the lifespan."""

from __future__ import annotations

import logging
import os
import shlex
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from . import __version__
from .admission import Slots
from .app_state import ATTRIBUTE as STATE_ATTRIBUTE
from .app_state import AppState, by_class
from .auth.brakes import AuditBudget, FailureLimiter
from .auth.routes import router as auth_router
from .baselines.routes import router as baselines_router
from .config import ADMIN_TOKEN_FILE as ADMIN_TOKEN_FILE  # where it was first defined
from .config import Settings
from .connic_api.routes import bounds_its_own_body
from .connic_api.routes import router as connic_router
from .db import make_engine, make_sessionmaker, session_scope
from .deps import SessionFactoryDep
from .errors import Conflict, ServiceUnavailable, error_body, error_responses
from .gates.notify import GateBodies, GateChanges
from .gates.routes import STATUS_READ_THREADS
from .gates.routes import router as gates_router
from .gates.status_reads import StatusReads
from .http_errors import install_handlers
from .metrics import Metrics
from .metrics_route import install_metrics
from .middleware import install_middleware
from .projects.routes import router as projects_router
from .projects.service import ensure_bootstrap
from .secrets.crypto import SecretBox
from .secrets.routes import router as secrets_router
from .ui.routes import error_page, install_ui

log = logging.getLogger(__name__)

# Room for the multipart envelope and the form fields around the bundle itself.
MULTIPART_OVERHEAD_BYTES = 64 * 1024

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# FastAPI builds each route's parameter models lazily, on the first request that reaches the
# route, under `warnings.catch_warnings()`. That context manager swaps the process-wide filter
# list and is not thread-safe: two first requests (or two apps) building at once restore each
# other's filters, and pydantic's schema build then fails with AttributeError
# `__pydantic_core_schema__`. So every app is built out before it serves, one at a time.
_WARM_UP_LOCK = threading.Lock()


def warm_up_routes(app: FastAPI) -> None:
    """Make every route build its models now, single-threaded, instead of on first use."""
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": "/__gate_warm_up__",  # matches nothing, so every route is tried
        "root_path": "",
        "headers": [],
        "query_string": b"",
    }
    with _WARM_UP_LOCK:
        for route in app.router.routes:
            route.matches(dict(scope))


class DeclaredSizeLimit:
    """Refuse a request whose Content-Length already says it is over the limit, unread."""

    def __init__(
        self, app: ASGIApp, limit_bytes: int, exempt: Callable[[str, str], bool] | None = None
    ) -> None:
        # exempt(method, path): a route that bounds its own (larger) body while streaming.
        self.app, self.limit, self.exempt = app, limit_bytes, exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not (
            self.exempt and self.exempt(scope["method"], scope["path"])
        ):
            headers = dict(scope.get("headers") or [])
            declared = headers.get(b"content-length")
            if declared and declared.isdigit() and int(declared) > self.limit:
                response = JSONResponse(
                    error_body(
                        "PayloadTooLarge",
                        f"the request declares {int(declared)} bytes; the upload limit is "
                        f"{self.limit - MULTIPART_OVERHEAD_BYTES} bytes",
                    ),
                    status_code=413,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def first_token_notice(token: str, path: Path) -> str:
    """The framed block a first start shows its admin token in, with the file it was saved to.

    Plain ASCII, each line whole and never wrapped (the box is as wide as its longest line),
    so that the token and the path can be copied from a terminal or a log alike.
    """
    lines = [
        "FIRST START: the admin token of project 'default', shown this once:",
        "",
        f"    {token}",
        "",
        "It was saved (mode 0600) to:",
        "",
        f"    {path}",
        "",
        "Use it as GATE_TOKEN, or as 'Authorization: Bearer <token>':",
        "",
        f"    export GATE_TOKEN=$(cat {shlex.quote(str(path))})",
    ]
    width = max(len(line) for line in lines)
    rule = "+" + "-" * (width + 2) + "+"
    body = [f"| {line.ljust(width)} |" for line in lines]
    return "\n" + "\n".join([rule, *body, rule]) + "\n\n"


def show_now(notice: str) -> None:
    """Write a start-up notice to stderr at once (not through logging: it holds a token)."""
    sys.stderr.write(notice)
    sys.stderr.flush()


async def settled(app: FastAPI, timeout: float = 10.0) -> None:
    """Until the start-up work the app goes on with after its lifespan's start, its change
    listener's connection (which logs once it listens), is done, or ``timeout`` passed: what
    is shown after this is the last start-up line of the API."""
    state = getattr(app.state, STATE_ATTRIBUTE, None)
    if isinstance(state, AppState):
        await state.part(GateChanges).wait_listening(timeout)


def bootstrap_admin(
    settings: Settings, factory: sessionmaker[Session], show: Callable[[str], None] = show_now
) -> Path | None:
    """Project `default` with an admin token: GATE_BOOTSTRAP_TOKEN's, or one made on first start.

    A made token is shown once: written 0600 to ``settings.admin_token_path()``, and its
    framed notice (first_token_notice) handed to ``show``, which writes it at once by default
    (`gate serve` and `gate api` hold it until the server listens, to show it last). Answers
    the file's path when a token was made, else None.
    """
    given = settings.bootstrap_token.get_secret_value() if settings.bootstrap_token else None
    for attempt in range(3):
        try:
            with session_scope(factory) as session:
                created = ensure_bootstrap(session, given)
            break
        except (IntegrityError, Conflict):
            # Another replica bootstrapped at the same moment; its rows are there now.
            if attempt == 2:
                raise
    if created is None:
        return None
    path = settings.admin_token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(created + "\n")
    show(first_token_notice(created, path))
    return path


def create_app(
    settings: Settings,
    metrics: Metrics | None = None,
    *,
    show_first_token: Callable[[str], None] = show_now,
    workers_up: Callable[[], int] | None = None,
) -> FastAPI:
    """``metrics``: a registry shared with in-process workers (`gate serve`); default: a new one.
    ``show_first_token``: what shows the first start's token notice (bootstrap_admin).
    ``workers_up``: how many embedded workers can claim a gate now (`gate serve`); /readyz
    answers 503 while none can. None: the workers are another process's (`gate api`)."""
    if not settings.database_url:
        raise ValueError("create_app needs settings.database_url (gate serve provides one)")
    database_url = settings.database_url

    registry = metrics or Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(database_url)
        sessions = make_sessionmaker(engine)
        bootstrap_admin(settings, sessions, show_first_token)
        changes, reads = GateChanges(database_url), StatusReads(database_url)
        state = AppState(
            settings=settings,
            engine=engine,
            sessions=sessions,
            metrics=registry,
            upload_slots=Slots(
                settings.max_concurrent_uploads,
                "uploads",
                "GATE_MAX_CONCURRENT_UPLOADS",
                per_project=settings.max_concurrent_uploads_per_project,
                per_project_setting="GATE_MAX_CONCURRENT_UPLOADS_PER_PROJECT",
            ),
            long_poll_slots=Slots(
                settings.max_concurrent_long_polls,
                "long-polls",
                "GATE_MAX_CONCURRENT_LONG_POLLS",
                per_project=settings.max_concurrent_long_polls_per_project,
                per_project_setting="GATE_MAX_CONCURRENT_LONG_POLLS_PER_PROJECT",
            ),
            status_read_threads=anyio.CapacityLimiter(STATUS_READ_THREADS),
            parts=by_class(
                SecretBox.from_settings(settings),  # not at import: the key may be made now
                FailureLimiter(settings.auth_failure_limit, settings.auth_failure_window_seconds),
                AuditBudget(
                    settings.auth_failure_audit_limit, settings.auth_failure_window_seconds
                ),
                GateBodies(),
                changes,
                reads,
            ),
        )
        setattr(app.state, STATE_ATTRIBUTE, state)
        changes.start()
        try:
            yield
        finally:
            await changes.stop()
            await reads.close()
            engine.dispose()

    app = FastAPI(
        title="Agent deploy gate",
        version=__version__,
        lifespan=lifespan,
        description="Judges agent-project bundles against their Connic-format test suites.",
    )
    install_handlers(app, pages=error_page)
    app.include_router(gates_router)
    app.include_router(projects_router)  # before auth's: the API's paths keep their order
    app.include_router(auth_router)
    app.include_router(secrets_router)
    app.include_router(baselines_router)
    app.include_router(connic_router)
    install_ui(app)
    install_metrics(app, settings, registry)
    app.add_middleware(
        DeclaredSizeLimit,
        limit_bytes=settings.upload_limit_bytes + MULTIPART_OVERHEAD_BYTES,
        exempt=bounds_its_own_body,
    )
    install_middleware(app, settings)  # last: request ids and the Host check wrap everything

    @app.get("/healthz", responses=error_responses({400: "A Host not in GATE_TRUSTED_HOSTS"}))
    def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        responses=error_responses(
            {
                400: "A Host not in GATE_TRUSTED_HOSTS",
                503: "The database does not answer, or (gate serve) no worker has started",
            }
        ),
    )
    def readyz(factory: SessionFactoryDep) -> dict[str, str | int]:
        """The database answers, and under `gate serve` a worker can claim a gate: a gate
        submitted now is claimed at once, not after the workers' start."""
        try:
            with session_scope(factory) as session:
                session.execute(text("SELECT 1"))
        except SQLAlchemyError:
            log.warning("readiness: the database does not answer", exc_info=True)
            raise ServiceUnavailable("the database does not answer") from None
        if workers_up is None:
            return {"status": "ready"}
        up = workers_up()
        if up < 1:
            raise ServiceUnavailable("no worker can claim a gate yet: the workers are starting")
        return {"status": "ready", "workers": up}

    warm_up_routes(app)
    return app

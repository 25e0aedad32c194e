"""The API process's state: one typed object, built in the app's lifespan.

Everything a request of this app may use (settings, sessions, the secrets box, the metrics
registry, the brakes and slots of this process, the status-read connections, the long-poll
listener) is an attribute of ``AppState``; routes and dependencies reach it through
``state_of``, never through loose ``app.state`` attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request

if TYPE_CHECKING:
    import anyio
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session, sessionmaker

    from .admission import Slots
    from .auth.brakes import AuditBudget, FailureLimiter
    from .config import Settings
    from .gates.notify import GateBodies, GateChanges
    from .gates.status_reads import StatusReads
    from .metrics import Metrics
    from .secrets.crypto import SecretBox

ATTRIBUTE = "gate"  # the one attribute of app.state


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    # Built in the lifespan, not at import: the key may be made on first start.
    secret_box: SecretBox
    metrics: Metrics  # shared with a worker process's relay under `gate serve`
    auth_failures: FailureLimiter
    auth_failure_audits: AuditBudget
    upload_slots: Slots  # concurrent uploads of this process, a share per project
    long_poll_slots: Slots
    gate_bodies: GateBodies  # gate bodies cached per revision
    gate_changes: GateChanges  # the one LISTEN gate_changed connection long-polls wait on
    status_reads: StatusReads  # the autocommit connections of the status fast path
    # Status reads in threads at once: fewer than the engine's pool, so a burst of polls
    # queues here instead of opening overflow connections for each read.
    status_read_threads: anyio.CapacityLimiter


def state_of(where: Request | FastAPI) -> AppState:
    """The app's state (of a request's app, or of the app itself) once its lifespan runs."""
    app = where.app if isinstance(where, Request) else where
    state: AppState | None = getattr(app.state, ATTRIBUTE, None)
    if state is None:
        raise RuntimeError("the app's state is built by its lifespan, which has not run")
    return state

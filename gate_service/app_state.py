"""The API process's state: one typed object, built in the app's lifespan.

Everything a request of this app may use is in ``AppState``; routes and dependencies reach
it through ``state_of``, never through loose ``app.state`` attributes. What every package
shares (settings, sessions, the metrics registry, the slots of this process) is an
attribute. What one package's own routes use and the package itself defines (auth's brakes
on guessing, the gates' long-poll listener, body cache and status-read connections, the
secrets box) is a part, found by its class: ``state_of(request).part(GateChanges)``. This
module names none of those classes, so it imports none of the packages whose routes import
it, and the service's packages form no import circle through it (the acyclic contract in
pyproject.toml counts annotation-only imports too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from fastapi import FastAPI, Request

if TYPE_CHECKING:
    import anyio
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session, sessionmaker

    from .admission import Slots
    from .config import Settings
    from .metrics import Metrics

ATTRIBUTE = "gate"  # the one attribute of app.state

T = TypeVar("T")


def by_class(*found: object) -> dict[type, object]:
    """The parts of an app's state, each by its own class (one part of a class)."""
    kept: dict[type, object] = {}
    for part in found:
        if type(part) in kept:
            raise ValueError(f"two parts of class {type(part).__name__}")
        kept[type(part)] = part
    return kept


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    metrics: Metrics  # shared with a worker process's relay under `gate serve`
    upload_slots: Slots  # concurrent uploads of this process, a share per project
    long_poll_slots: Slots
    # Status reads in threads at once: fewer than the engine's pool, so a burst of polls
    # queues here instead of opening overflow connections for each read.
    status_read_threads: anyio.CapacityLimiter
    # The packages' own parts, by class (``by_class``), built in the lifespan: the secrets box
    # (its key may be made on first start), auth's FailureLimiter and AuditBudget, the
    # gates' GateBodies (bodies cached per revision), GateChanges (the one LISTEN
    # gate_changed connection long-polls wait on) and StatusReads (the autocommit
    # connections of the status fast path).
    parts: dict[type, object] = field(default_factory=dict)

    def part(self, kind: type[T]) -> T:
        """The part of class ``kind``; a RuntimeError when the lifespan built none."""
        found = self.parts.get(kind)
        if not isinstance(found, kind):
            raise RuntimeError(f"the app's state has no {kind.__name__}")
        return found


def state_of(where: Request | FastAPI) -> AppState:
    """The app's state (of a request's app, or of the app itself) once its lifespan runs."""
    app = where.app if isinstance(where, Request) else where
    state: AppState | None = getattr(app.state, ATTRIBUTE, None)
    if state is None:
        raise RuntimeError("the app's state is built by its lifespan, which has not run")
    return state

"""The `/metrics` route: who may read it, and the state read from Postgres at each scrape.

The instruments (metrics.py) are observed by workers, which import no HTTP code; this module
is the API's: it registers ``DatabaseCollector`` with the app's registry and serves it.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from .app_state import state_of
from .auth.deps import bearer_token, principal
from .db import session_scope
from .errors import Forbidden, error_responses
from .models import GateStatus

if TYPE_CHECKING:
    from .config import Settings
    from .metrics import Metrics

log = logging.getLogger(__name__)


# -- state read from Postgres at scrape time -------------------------------------------------

# Projects with nothing queued answer 0, so their series do not vanish between scrapes.
QUEUE_DEPTH_SQL = text(
    "SELECT p.name, coalesce(q.n, 0) FROM projects p LEFT JOIN ("
    " SELECT g.project_id, count(*) AS n FROM jobs j JOIN gates g ON g.id = j.gate_id"
    " WHERE j.state = 'queued' GROUP BY g.project_id"
    ") q ON q.project_id = p.id"
)
GATES_BY_STATUS_SQL = text("SELECT status, count(*) FROM gates GROUP BY status")


class DatabaseCollector(Collector):
    """Queue depth per project and gates per status, read when Prometheus scrapes.

    ``sessions`` gives the app's session factory, or None before its lifespan made one: the
    collector is registered with the app, so a lifespan run twice never registers it twice.
    """

    def __init__(self, sessions: Callable[[], sessionmaker[Session] | None]) -> None:
        self.sessions = sessions

    def describe(self) -> Iterable[Metric]:
        # Names only: registering must not query the database.
        return list(self._families())

    def _families(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "gate_queue_depth", "Gates waiting for a worker, per project.", labels=["project"]
        )
        yield GaugeMetricFamily("gate_gates", "Stored gates, per status.", labels=["status"])
        yield GaugeMetricFamily(
            "gate_database_up", "1 when the database answered this scrape's queries, else 0."
        )

    def collect(self) -> Iterable[Metric]:
        depth, gates, up = self._families()
        factory = self.sessions()
        if factory is None:
            up.add_metric([], 0)
            return [up]
        try:
            with session_scope(factory) as session:
                queued = session.execute(QUEUE_DEPTH_SQL).all()
                counts = {str(s): int(n) for s, n in session.execute(GATES_BY_STATUS_SQL).all()}
        except SQLAlchemyError:
            log.warning("metrics: the database does not answer", exc_info=True)
            up.add_metric([], 0)
            return [up]
        for project, n in queued:
            depth.add_metric([str(project)], int(n))
        for status in GateStatus:
            gates.add_metric([status.value], counts.pop(status.value, 0))
        for other, n in counts.items():  # a status this code does not know yet
            gates.add_metric([other], n)
        up.add_metric([], 1)
        return [depth, gates, up]


# -- the /metrics route ----------------------------------------------------------------------


def metrics_reader(settings: Settings) -> Callable[[Request], None]:
    """GATE_METRICS_TOKEN, or an admin token of project `default` (per-project queue depth
    names every project, so neither anonymous callers nor other projects' tokens may read)."""
    expected = settings.metrics_token.get_secret_value() if settings.metrics_token else None

    def check(request: Request) -> None:
        given = bearer_token(request)
        if expected and given and hmac.compare_digest(given.encode(), expected.encode()):
            return
        who = principal(request)  # 429 after repeated failures, 401 for a bad token
        if not who.service_admin:
            raise Forbidden(
                "/metrics needs GATE_METRICS_TOKEN or an admin token of project 'default'"
            )

    return check


METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The Prometheus text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    },
    **error_responses(
        {
            400: "A Host not in GATE_TRUSTED_HOSTS",
            401: "No token, or an unknown one",
            403: "A token that is neither GATE_METRICS_TOKEN nor an admin token of 'default'",
            429: "Too many failed authentications from this client",
        }
    ),
}


def install_metrics(app: FastAPI, settings: Settings, metrics: Metrics) -> None:
    """`/metrics` over ``metrics`` (one app per Metrics), with the database collector."""

    def sessions() -> sessionmaker[Session] | None:
        try:
            return state_of(app).sessions
        except RuntimeError:  # scraped before the lifespan has run
            return None

    metrics.registry.register(DatabaseCollector(sessions))
    check = metrics_reader(settings)

    @app.get(
        "/metrics",
        response_class=Response,
        responses=METRICS_RESPONSES,
        summary="Prometheus metrics",
    )
    def prometheus_metrics(request: Request) -> Response:
        """Queue depth per project and gates per status (read from the database now), and
        this process's case and gate durations, container start latency, image cache lookups
        and reaped containers. Needs GATE_METRICS_TOKEN or an admin token of `default`."""
        check(request)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

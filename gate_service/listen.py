"""LISTEN connections to Postgres: how they connect, and how they reconnect.

Two listeners use this, one per process each: the API's (gates/notify.py, which wakes
long-polls on `gate_changed`) and the worker's (worker/wakeup.py, which wakes idle workers on
`gate_jobs`). Neither side imports the other; both import this.
"""

from __future__ import annotations

from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import make_url

RECONNECT_MIN_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 10.0
STABLE_SECONDS = 30.0  # a listening connection that lasted this long was a good one


def reconnect_delay(previous: float, lasted_seconds: float) -> float:
    """The wait before a listener reconnects: doubling (up to the maximum) while connecting
    fails or connections break at once, the minimum again after one that lasted, so a
    connection that breaks right after connecting is not retried twice a second forever."""
    if lasted_seconds >= STABLE_SECONDS:
        return RECONNECT_MIN_SECONDS
    return min(previous * 2, RECONNECT_MAX_SECONDS)


def libpq_conninfo(database_url: str) -> str:
    """A SQLAlchemy or plain postgresql:// URL as a libpq one (psycopg connects with it)."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def listen_conninfo(database_url: str, application_name: str) -> str:
    """A listening connection's: TCP keepalives, so that a peer that vanishes without
    closing is noticed rather than waited on forever (this listener and the worker's)."""
    return make_conninfo(
        libpq_conninfo(database_url),
        application_name=application_name,
        connect_timeout=10,  # a server that does not answer is retried, not waited on
        keepalives=1,
        keepalives_idle=30,
        keepalives_interval=10,
        keepalives_count=3,
    )

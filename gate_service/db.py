"""Engine and session construction; nothing here connects at import time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker


def sqlalchemy_url(url: str) -> str:
    """Accept plain postgresql:// URLs and pin the psycopg 3 driver."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    return create_engine(
        sqlalchemy_url(url), pool_pre_ping=True, pool_size=pool_size, max_overflow=10
    )


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """The one owner of a unit of work's transaction: commit on success, roll back on error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# SQLSTATE classes of failures that the same write meets again: data exceptions (22: NaN
# in JSON, NUL, a value too long) and program limits (54: too large, too complex).
_REPEATING_CLASSES = ("22", "54")


def refused_write(exc: BaseException) -> str | None:
    """Why Postgres (or the driver) refused this data, when writing it again cannot help.

    None for everything else (a lost connection, a deadlock, a serialisation failure), which
    another attempt may get past. The answer is short and holds no data from the statement.
    """
    if isinstance(exc, UnicodeEncodeError):  # psycopg encodes text before sending it
        return "a text holds a character UTF-8 cannot encode (a lone surrogate)"
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None) or ""
    if isinstance(orig, psycopg.DataError) or sqlstate[:2] in _REPEATING_CLASSES:
        first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        code = f", SQLSTATE {sqlstate}" if sqlstate else ""
        return f"Postgres refused the data: {first[:200]} ({type(orig).__name__}{code})"
    return None

"""A few autocommit connections on the event loop, for the one query of a status poll.

``GET /v1/gates/{id}`` is what every pipeline polls. Its common case needs one query (the
token and the gate's revision, see routes.py) and then answers 304 or a cached body. Running
that query here, with psycopg's async API on the event loop, costs no threadpool hop, no
pooled-connection ping and no transaction round trips. Anything unusual (an error, a
connection lost to a Postgres restart) makes the caller fall back to the ordinary path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row

from ..listen import libpq_conninfo

log = logging.getLogger(__name__)

CONNECTIONS = 4


class StatusReads:
    """Up to ``size`` autocommit connections, opened on first use and reused; built in the
    app's lifespan and closed on shutdown. Used only from the event loop."""

    def __init__(self, database_url: str, size: int = CONNECTIONS) -> None:
        self.conninfo = libpq_conninfo(database_url)
        self._slots = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._closed = False

    async def fetch_one(self, query: str, params: Mapping[str, Any]) -> Any:
        """The first row of ``query`` (a named tuple) or None; raises what psycopg raises."""
        async with self._slots:
            for attempt in range(2):
                pooled = bool(self._idle)
                conn = self._idle.pop() if pooled else await self._connect()
                try:
                    cursor = await conn.execute(query, params)
                    row = await cursor.fetchone()
                except psycopg.OperationalError:
                    await conn.close()
                    if not pooled or attempt:
                        raise
                    # A kept connection died (a Postgres restart?): so did the others kept.
                    await self._close_idle()
                    continue
                except BaseException:
                    await conn.close()  # cancelled mid-query, or worse: never reused
                    raise
                if self._closed:
                    await conn.close()
                else:
                    self._idle.append(conn)
                return row
        raise AssertionError("unreachable")

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self.conninfo,
            autocommit=True,
            row_factory=namedtuple_row,
            application_name="gate-api-status",
        )

    async def close(self) -> None:
        self._closed = True
        await self._close_idle()

    async def _close_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

"""A few autocommit connections on the event loop, for the one query of a status poll.

``GET /v1/gates/{id}`` is what every pipeline polls. Its common case needs one query (the
token and the gate's revision, ``token_and_revision``) and then answers 304 or a cached
body. Running that query here, with psycopg's async API on the event loop, costs no
threadpool hop, no pooled-connection ping and no transaction round trips. Anything unusual
(an error, a connection lost to a Postgres restart) makes the caller fall back to the
ordinary path.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row

from ..listen import libpq_conninfo

log = logging.getLogger(__name__)

CONNECTIONS = 4

# The token and the gate's revision in one autocommit query: a status poll's whole database
# work when the token needs no write and the body of that revision is cached.
_TOKEN_AND_REVISION = (
    "SELECT t.id, t.project_id, p.name, t.scopes, t.token_sha256, t.revoked_at, t.expires_at,"
    " t.last_used_at, g.revision"
    " FROM api_tokens t JOIN projects p ON p.id = t.project_id"
    " LEFT JOIN gates g ON g.id = %(gate)s AND g.project_id = t.project_id"
    " WHERE t.token_sha256 = %(digest)s"
)
_REVISION = "SELECT revision, status FROM gates WHERE id = %(gate)s AND project_id = %(project)s"


class StatusReads:
    """Up to ``size`` autocommit connections, opened on first use and reused; built in the
    app's lifespan and closed on shutdown. Used only from the event loop."""

    def __init__(self, database_url: str, size: int = CONNECTIONS) -> None:
        self.conninfo = libpq_conninfo(database_url)
        self._slots = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._closed = False
        self.queries = 0  # made, for tests

    async def fetch_one(self, query: str, params: Mapping[str, Any]) -> Any:
        """The first row of ``query`` (a named tuple) or None; raises what psycopg raises."""
        self.queries += 1
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

    async def token_and_revision(self, gate_id: uuid.UUID, digest: str) -> Any:
        """The token of ``digest`` (id, project, scopes, revocation, expiry, last use) and the
        revision of ``gate_id`` if it is that project's (else None), in one query; None when
        no token has that digest."""
        return await self.fetch_one(_TOKEN_AND_REVISION, {"gate": gate_id, "digest": digest})

    async def revision(self, gate_id: uuid.UUID, project_id: uuid.UUID) -> tuple[int, str] | None:
        """The gate's revision and status, or None when the project has no such gate."""
        row = await self.fetch_one(_REVISION, {"gate": gate_id, "project": project_id})
        return None if row is None else (int(row.revision), str(row.status))

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

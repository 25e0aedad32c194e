"""Gate changes pushed from Postgres: one LISTEN connection per API process wakes long-polls.

Migration 0004 makes Postgres `NOTIFY gate_changed` whenever a gate's revision changes (or
the gate is deleted), from whichever process committed the change; since migration 0015 its
payload is `'<gate id> <revision> <status>'` (a deleted gate's: its id alone). ``GateChanges``
holds the process's one listening connection, in a task on the event loop started by the
app's lifespan, and wakes the waiters of that gate id with what the payload says. A waiter
that was told the new revision and status needs no query to know whether to answer; one woken
without them (a deletion, a reconnect, an id alone) reads its gate once.

Nothing here queries per waiter: waiting is an ``asyncio.Event``. Notifications can be lost
while the connection is down, so after every (re)connect all waiters are woken to re-check,
and each waiter also re-checks on its own every ``recheck_seconds``, in case one is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator

import psycopg

from ..listen import RECONNECT_MIN_SECONDS, listen_conninfo, reconnect_delay

log = logging.getLogger(__name__)

CHANNEL = "gate_changed"  # as in migrations/versions/0004_gate_change_notify.py
RECHECK_SECONDS = 10.0  # a waiter re-reads at least this often, whatever it hears
HEALTH_CHECK_SECONDS = 30.0  # an idle listening connection is probed this often


class Waiter:
    """One long-poll's subscription to one gate: set when that gate may have changed."""

    def __init__(self, gate_id: uuid.UUID) -> None:
        self.gate_id = gate_id
        self.sleeping = False  # in wait(): it has read its gate and issues nothing now
        self._event = asyncio.Event()
        self._heard: tuple[int, str] | None = None  # the newest (revision, status) told
        self._untold = False  # woken by something that did not say what changed

    def clear(self) -> None:
        """Called before each read, so a change committed during the read wakes it again."""
        self._event.clear()
        self._heard, self._untold = None, False

    def wake(self, change: tuple[int, str] | None = None) -> None:
        """``change``: the gate's revision and status after it, when the notification said."""
        if change is None:
            self._untold = True
        elif self._heard is None or change[0] > self._heard[0]:
            self._heard = change
        self._event.set()

    @property
    def heard(self) -> tuple[int, str] | None:
        """The gate's newest revision and status told since the last ``clear``; None when
        nothing was told, or a wake-up did not say (then only a read of the gate knows)."""
        return None if self._untold else self._heard

    async def wait(self, timeout: float) -> bool:
        """True when woken, False when ``timeout`` seconds passed first."""
        self.sleeping = True
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        finally:
            self.sleeping = False
        return True


class GateChanges:
    """The process's one LISTEN connection and the long-polls waiting on it.

    Built and started in the app's lifespan (``start``), stopped on shutdown (``stop``);
    all its methods run on the event loop that serves the requests.
    """

    def __init__(
        self,
        database_url: str,
        *,
        recheck_seconds: float = RECHECK_SECONDS,
        health_check_seconds: float = HEALTH_CHECK_SECONDS,
    ) -> None:
        self.conninfo = listen_conninfo(database_url, "gate-api-listener")
        self.recheck_seconds = recheck_seconds
        self.health_check_seconds = health_check_seconds
        self._waiters: dict[uuid.UUID, set[Waiter]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self.backend_pid: int | None = None  # the listening session's, while connected
        self.connects = 0  # successful (re)connects, for tests and metrics
        self.notifications = 0

    # -- waiters -----------------------------------------------------------------------

    @contextlib.contextmanager
    def subscribe(self, gate_id: uuid.UUID) -> Iterator[Waiter]:
        """Register a waiter for ``gate_id`` for the block; subscribe *before* the first read."""
        waiter = Waiter(gate_id)
        self._waiters.setdefault(gate_id, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(gate_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[gate_id]

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    @property
    def sleeping(self) -> int:
        """Waiters that have read their gate and now wait for a wake-up."""
        return sum(w.sleeping for waiters in self._waiters.values() for w in waiters)

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    async def wait_listening(self, timeout: float) -> bool:
        """True once the connection listens (for tests and readiness), False after timeout."""
        try:
            await asyncio.wait_for(self._listening.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _wake(self, gate_id: uuid.UUID, change: tuple[int, str] | None = None) -> None:
        for waiter in self._waiters.get(gate_id, ()):
            waiter.wake(change)

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.wake()

    def _on_payload(self, payload: str) -> None:
        self.notifications += 1
        gate_text, _, told = payload.partition(" ")
        try:
            gate_id = uuid.UUID(gate_text)
        except ValueError:
            log.warning("ignoring a %s notification with payload %r", CHANNEL, payload[:100])
            return
        self._wake(gate_id, _change(told))

    # -- the listening connection --------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="gate-changes-listener"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._listening.clear()
        self._wake_all()  # nobody is left waiting for a notification that cannot come

    async def _run(self) -> None:
        delay = RECONNECT_MIN_SECONDS / 2
        while True:
            began = time.monotonic()
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a lost connection, a restart, a refused connect
                log.warning("gate change listener: %s; reconnecting", exc)
            # Waiters are woken once listening again (see _listen), when a re-read can work.
            self._listening.clear()
            self.backend_pid = None
            delay = reconnect_delay(delay, time.monotonic() - began)
            await asyncio.sleep(delay)

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        async with conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            self.backend_pid = conn.info.backend_pid
            self.connects += 1
            self._listening.set()
            # Anything committed before LISTEN took effect was not heard: re-check all.
            self._wake_all()
            log.info("gate change listener: listening (backend pid %s)", self.backend_pid)
            while True:
                async for note in conn.notifies(timeout=self.health_check_seconds):
                    self._on_payload(note.payload)
                # Quiet for a while: make sure the connection still answers. A notification
                # arriving meanwhile waits for the next notifies() (psycopg's backlog, kept
                # only while no notify handler is registered: do not add one).
                await conn.execute("SELECT 1")


def _change(told: str) -> tuple[int, str] | None:
    """The (revision, status) of a payload's tail, ``'<revision> <status>'``; None for none
    (a deleted gate, or a trigger from before migration 0015) or anything else."""
    revision, _, status = told.partition(" ")
    if not revision.isdigit() or not status or " " in status:
        return None
    return int(revision), status


class GateBodies:
    """Serialised gate bodies by gate id, valid for one revision: a re-read of an unchanged
    gate costs one revision query, not the full read and its serialisation.

    Bounded in bytes (least recently used out first); used from threadpool threads.
    """

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, max_body_bytes: int = 1024 * 1024):
        self.max_bytes, self.max_body_bytes = max_bytes, max_body_bytes
        # By gate and the number of cases the body holds (GET's cases_limit).
        self._bodies: OrderedDict[tuple[uuid.UUID, int], tuple[int, uuid.UUID, bytes]] = (
            OrderedDict()
        )
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(
        self, gate_id: uuid.UUID, revision: int, project_id: uuid.UUID, page: int
    ) -> bytes | None:
        with self._lock:
            entry = self._bodies.get((gate_id, page))
            if entry is None or entry[0] != revision or entry[1] != project_id:
                self.misses += 1
                return None
            self._bodies.move_to_end((gate_id, page))
            self.hits += 1
            return entry[2]

    def put(
        self, gate_id: uuid.UUID, revision: int, project_id: uuid.UUID, body: bytes, page: int
    ) -> None:
        if len(body) > self.max_body_bytes:
            return
        with self._lock:
            old = self._bodies.pop((gate_id, page), None)
            if old is not None:
                self._bytes -= len(old[2])
                if old[0] > revision:  # a slower reader of an older revision: keep the newer
                    self._bodies[(gate_id, page)] = old
                    self._bytes += len(old[2])
                    return
            self._bodies[(gate_id, page)] = (revision, project_id, body)
            self._bytes += len(body)
            while self._bytes > self.max_bytes and self._bodies:
                _, (_, _, dropped) = self._bodies.popitem(last=False)
                self._bytes -= len(dropped)

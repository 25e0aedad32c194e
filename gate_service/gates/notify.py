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

``wait_for_change`` is the long-poll itself (``GET /v1/gates/{id}?wait=N``): the route holds
the slot and says how to read the gate and what its ETag is; the waiting, the re-checks on
the loop (``StatusReads``) and the gathering of a running gate's changes are here. No HTTP
here either: it answers an ETag and a body, the route makes the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator

import psycopg

from ..listen import RECONNECT_MIN_SECONDS, listen_conninfo, reconnect_delay
from ..models import GateStatus
from .status_reads import StatusReads

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


# What a long-poll's look on the loop found (``_peek``).
_SAME, _RUNNING, _OTHER = "same", "running", "other"
TERMINAL_STATUSES = frozenset(s.value for s in GateStatus if s.terminal)


async def wait_for_change(
    changes: GateChanges,
    reads: StatusReads,
    *,
    gate_id: uuid.UUID,
    project_id: uuid.UUID,
    known: int | None,
    if_none_match: str | None,
    etag_of: Callable[[int], str],
    look: Callable[[], Awaitable[tuple[str, bytes | None]]],
    deadline: float,
    settle: float,
) -> tuple[str, bytes | None]:
    """Wait until the gate no longer has the client's ETag, or until ``deadline`` (a
    ``time.monotonic()`` value): its ETag, and its body (None: unchanged, a 304).

    ``known``: the gate's revision when the token was checked (None: not known; -1: no such
    gate). ``etag_of``: the ETag the route answers for a revision. ``look``: one read of the
    gate off the loop, its ETag and its body when that differs from ``if_none_match``.
    ``settle``: GATE_LONG_POLL_SETTLE_SECONDS.
    """
    # Subscribed before the first read, and cleared before each re-check: a change
    # committed while reading wakes the waiter again instead of being missed.
    with changes.subscribe(gate_id) as waiter:
        # Waiting happens on the event loop, so a long-poll holds no thread or lock.
        if known not in (None, -1) and etag_of(known) == if_none_match:
            # Unchanged when the token was checked; subscribed now, one look on the loop
            # closes the gap between the two (no thread, no session).
            etag, body = if_none_match, None
            if await _peek(reads, gate_id, project_id, etag, etag_of) is not _SAME:
                etag, body = await look()
        else:
            etag, body = await look()
        answer_at: float | None = None  # set once a change of a running gate is seen
        while body is None:
            now = time.monotonic()
            if now >= deadline:
                break
            if answer_at is not None and now >= answer_at:
                etag, body = await look()
                answer_at = None
                continue
            # Woken by a notification for this gate (or a reconnect of the listener);
            # re-checks on its own now and then, in case a notification was lost.
            until = deadline if answer_at is None else answer_at
            woken = await waiter.wait(min(until - now, changes.recheck_seconds))
            heard = waiter.heard
            waiter.clear()
            if answer_at is not None and not woken:
                continue  # gathering, and nothing new: the answer is read when it is due
            if woken and heard is not None:
                # The notification said the new revision and status: no query needed.
                seen = _seen(*heard, etag, etag_of)
            else:
                # The revision and status first, on the loop: an unchanged gate (a lost
                # notification's re-check, a reconnect's wake-up) costs no thread.
                seen = await _peek(reads, gate_id, project_id, etag, etag_of)
            if seen is _SAME:
                continue
            if seen is _RUNNING and settle > 0:
                # A running gate changes once or twice per case: answering each change
                # would cost a read, an answer and a new request per case for every
                # poller. Its changes are gathered for up to `settle` seconds into one
                # answer; an end (or a gone gate) is answered at once.
                if answer_at is None:
                    answer_at = min(time.monotonic() + settle, deadline)
                continue
            etag, body = await look()
            answer_at = None
        return etag, body


async def _peek(
    reads: StatusReads,
    gate_id: uuid.UUID,
    project_id: uuid.UUID,
    etag: str,
    etag_of: Callable[[int], str],
) -> str:
    """_SAME when the gate still has this ETag; _RUNNING when it changed and has not ended;
    _OTHER when it ended, is gone, or the quick query failed (the caller then reads it the
    ordinary way)."""
    try:
        found = await reads.revision(gate_id, project_id)
    except psycopg.Error:
        log.debug("status re-check: falling back to the ordinary path", exc_info=True)
        return _OTHER
    if found is None:
        return _OTHER
    return _seen(*found, etag, etag_of)


def _seen(revision: int, status: str, etag: str, etag_of: Callable[[int], str]) -> str:
    """What a gate at ``revision`` with ``status`` is to a long-poll that holds ``etag``."""
    if etag_of(revision) == etag:
        return _SAME
    return _OTHER if status in TERMINAL_STATUSES else _RUNNING


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

"""Idle workers woken when a job may be claimable: one LISTEN connection per worker process.

Migration 0005 makes Postgres `NOTIFY gate_jobs` when a job is queued (a new gate, a job
handed back) or a running one ends (the per-project cap frees a place). ``JobWakeup`` holds
the process's listening connection in a thread and sets every subscribed event on each
notification; a worker clears its event before it claims and waits on it after finding
nothing, so a notification during the claim is never lost.

The poll interval (GATE_WORKER_POLL_SECONDS) stays as the upper bound of every wait:
notifications sent while the connection is down are not heard, so each (re)connect wakes
everyone once, and a worker with no listener at all (tests building a WorkerContext by
hand) polls as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import psycopg

from ..listen import RECONNECT_MIN_SECONDS, listen_conninfo, reconnect_delay

log = logging.getLogger(__name__)

CHANNEL = "gate_jobs"  # as in migrations/versions/0005_job_ready_notify.py
# How often a thread that waits (the listener, a worker waiting for work) looks at stop.
STOP_CHECK_SECONDS = 1.0


class JobWakeup:
    """The process's LISTEN gate_jobs connection and the events of the workers waiting."""

    def __init__(self, database_url: str, stop: threading.Event) -> None:
        self.conninfo = listen_conninfo(database_url, "gate-worker-wakeup")
        self.stop = stop
        self._events: set[threading.Event] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()
        self.backend_pid: int | None = None  # the listening session's, while connected
        self.connects = 0  # successful (re)connects, for tests
        self.notifications = 0

    @contextlib.contextmanager
    def subscribe(self, event: threading.Event) -> Iterator[threading.Event]:
        """Set ``event`` on every notification (and on stop) for the block."""
        with self._lock:
            self._events.add(event)
        try:
            yield event
        finally:
            with self._lock:
                self._events.discard(event)

    def wake_all(self) -> None:
        with self._lock:
            for event in self._events:
                event.set()

    def start(self) -> threading.Thread:
        """Start listening in a thread of its own (once); it ends when ``stop`` is set."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gate-job-wakeup", daemon=True)
            self._thread.start()
        return self._thread

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        delay = RECONNECT_MIN_SECONDS / 2
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                self._listen()
            except Exception as exc:  # a lost connection, a restart, a refused connect
                if not self.stop.is_set():
                    log.warning("job wake-up listener: %s; reconnecting", exc)
            self.listening.clear()
            self.backend_pid = None
            # Each reconnect wakes everyone: one that breaks at once must not repeat quickly.
            delay = reconnect_delay(delay, time.monotonic() - began)
            self.stop.wait(delay)
        self.wake_all()  # whoever waits learns of the stop now, not at its next poll

    def _listen(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self.backend_pid = conn.info.backend_pid
            self.connects += 1
            self.listening.set()
            # Anything queued before LISTEN took effect was not heard: everyone looks once.
            self.wake_all()
            while not self.stop.is_set():
                for _ in conn.notifies(timeout=STOP_CHECK_SECONDS):
                    self.notifications += 1
                    self.wake_all()

"""Prometheus instruments: one registry per app or worker process, never the global default.

This module holds the instruments workers observe into and the relay between processes; it
imports no HTTP code, so the worker depends on neither FastAPI nor auth. The `/metrics` route,
its reader check and the state read from Postgres at scrape time are in metrics_route.py.

Two kinds of figure, exposed together on `/metrics`:

- **State**, read from Postgres at scrape time by ``DatabaseCollector`` (queue depth per
  project, gates per status): one cheap query each, so every API replica answers the same
  without sharing anything but the database.
- **Events**, observed where they happen by ``Metrics`` (case and gate durations, container
  start latency, image cache hits and misses, reaped containers). Workers observe them in
  their own process: `gate serve` runs its workers in a process of their own that relays
  every observation to the API's ``Metrics`` (``RelayedMetrics``); a standalone
  `gate worker` serves its own registry on GATE_WORKER_METRICS_PORT. They are not derived
  from the database at scrape time: a histogram needs each observation, and counters that
  retention could shrink are not counters.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.exposition import generate_latest
from sqlalchemy import event
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .config import Settings
    from .models import Gate

log = logging.getLogger(__name__)

CASE_SECONDS_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
GATE_SECONDS_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
START_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """A registry and the instruments workers observe into; made at startup, never at import."""

    def __init__(self, *, process: bool = True) -> None:
        self.registry = CollectorRegistry()
        if process:  # process_* (CPU, memory, open files) of this process, from /proc
            ProcessCollector(registry=self.registry)
        self.case_seconds = Histogram(
            "gate_case_duration_seconds",
            "Wall time of a judged case's container, by the case's status.",
            ["status"],
            buckets=CASE_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.gate_seconds = Histogram(
            "gate_duration_seconds",
            "Time from a gate's start to its verdict, by the gate's final status.",
            ["status"],
            buckets=GATE_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.queued_seconds = Histogram(
            "gate_queued_seconds",
            "Time from a gate's submission until it left the queue: started by a worker, or "
            "cancelled before any worker started it.",
            ["outcome"],
            buckets=GATE_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.container_start_seconds = Histogram(
            "gate_container_start_seconds",
            "Time to create and start a case container.",
            buckets=START_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.image_cache = Counter(
            "gate_image_cache_lookups",
            "Test image lookups: hit (the bundle's image was built already) or miss (built).",
            ["result"],
            registry=self.registry,
        )
        self.reaped = Counter(
            "gate_containers_reaped",
            "Case containers the reaper removed (left by dead workers, cancelled or lost gates).",
            registry=self.registry,
        )
        self.gc_passes = Counter(
            "gate_gc_passes",
            "Garbage-collection passes: ok (scratch directories, and images when due) or "
            "failed (logged; tried again at the next pass).",
            ["result"],
            registry=self.registry,
        )
        self.gc_removed = Counter(
            "gate_gc_removed",
            "What garbage collection removed: test_image, runner_image, build_leftover "
            "(untagged images a killed build left) or scratch_dir.",
            ["kind"],
            registry=self.registry,
        )
        self.gc_freed_bytes = Counter(
            "gate_gc_freed_bytes",
            "Bytes of image layers garbage collection freed.",
            registry=self.registry,
        )
        self.test_image_bytes = Gauge(
            "gate_test_image_bytes",
            "What the test images that stayed held after the last image pass (compare with "
            "GATE_TEST_IMAGE_BUDGET_BYTES).",
            registry=self.registry,
        )

    # -- observations, one line at each hook point --------------------------------------------

    def case_judged(self, session: Session, status: str, duration_ms: int) -> None:
        """A case's outcome, counted once its transaction commits (a retry would recount)."""
        _after_commit(session, lambda: self.record("case", str(status), duration_ms / 1000))

    def gate_finished(self, session: Session, gate: Gate) -> None:
        """A gate's verdict, counted once its transaction commits; unstarted gates are not."""
        status, started, finished = str(gate.status), gate.started_at, gate.finished_at
        if started is None or finished is None:
            return
        seconds = max(0.0, (finished - started).total_seconds())
        _after_commit(session, lambda: self.record("gate", status, seconds))

    def gate_started(self, session: Session, gate: Gate) -> None:
        """A gate a worker just started for the first time: its time in the queue."""
        self._left_queue(session, "started", gate, gate.started_at)

    def gate_ended_unstarted(self, session: Session, gate: Gate) -> None:
        """A gate that ended before any worker started it (cancelled while queued): its time
        in the queue, by its status. Nothing for a gate that did start."""
        if gate.started_at is None and gate.finished_at is not None:
            self._left_queue(session, str(gate.status), gate, gate.finished_at)

    def _left_queue(
        self, session: Session, outcome: str, gate: Gate, left: datetime | None
    ) -> None:
        if left is None or gate.created_at is None:
            return
        seconds = max(0.0, (left - gate.created_at).total_seconds())
        _after_commit(session, lambda: self.record("queued", outcome, seconds))

    def image_lookup(self, *, hit: bool) -> None:
        self.record("image", "hit" if hit else "miss")

    def container_started(self, start_ms: int | None) -> None:
        if start_ms is not None:
            self.record("start", start_ms / 1000)

    def containers_reaped(self, count: int) -> None:
        if count > 0:
            self.record("reaped", count)

    def gc_pass(
        self,
        removed: Mapping[str, int] | None,
        freed_bytes: int = 0,
        held_bytes: int | None = None,
    ) -> None:
        """One garbage-collection pass (worker/gc.py says what it removed): ``removed``
        counts what went by kind (test_image, runner_image, build_leftover, scratch_dir),
        None when the pass failed; ``held_bytes`` what the test images hold after it, when
        it looked at the engine's images (not only scratch directories)."""
        if removed is None:
            self.record("gc", "failed")
            return
        self.record("gc", "ok", dict(removed), freed_bytes, held_bytes)

    def record(self, kind: str, *values: Any) -> None:
        """One observation into this registry (``RelayedMetrics`` sends it to another's)."""
        if kind == "case":
            self.case_seconds.labels(str(values[0])).observe(float(values[1]))
        elif kind == "gate":
            self.gate_seconds.labels(str(values[0])).observe(float(values[1]))
        elif kind == "queued":
            self.queued_seconds.labels(str(values[0])).observe(float(values[1]))
        elif kind == "image":
            self.image_cache.labels(str(values[0])).inc()
        elif kind == "start":
            self.container_start_seconds.observe(float(values[0]))
        elif kind == "reaped":
            self.reaped.inc(float(values[0]))
        elif kind == "gc":
            self._record_gc(*values)
        else:
            log.warning("metrics: an observation of unknown kind %r was dropped", kind)

    def _record_gc(
        self,
        result: str,
        removed: dict[str, int] | None = None,
        freed: int = 0,
        held: int | None = None,
    ) -> None:
        self.gc_passes.labels(str(result)).inc()
        for kind, count in (removed or {}).items():
            self.gc_removed.labels(str(kind)).inc(int(count))
        self.gc_freed_bytes.inc(int(freed))
        if held is not None:
            self.test_image_bytes.set(int(held))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class RelayedMetrics(Metrics):
    """A worker process's instruments when `gate serve` started it: every observation goes
    to the API process over a pipe, one JSON line each, so the API's /metrics shows them
    (``relay_into`` applies them there)."""

    def __init__(self, fd: int) -> None:
        super().__init__(process=False)
        self._out = os.fdopen(fd, "w", buffering=1)
        self._lock = threading.Lock()

    def record(self, kind: str, *values: Any) -> None:
        line = json.dumps([kind, *values]) + "\n"
        with self._lock:  # one line per write, whichever thread observes
            try:
                self._out.write(line)
            except (OSError, ValueError):  # the API process is gone: nothing to show it to
                pass


def relay_into(metrics: Metrics, fd: int) -> threading.Thread:
    """Apply a worker process's relayed observations (RelayedMetrics) until it closes ``fd``."""

    def read() -> None:
        with os.fdopen(fd, "r") as lines:
            for line in lines:
                try:
                    kind, *values = json.loads(line)
                    metrics.record(str(kind), *values)
                except (ValueError, TypeError, IndexError):
                    log.warning("metrics: a malformed relayed observation was dropped")

    thread = threading.Thread(target=read, name="gate-metrics-relay", daemon=True)
    thread.start()
    return thread


def serve_worker_metrics(settings: Settings, metrics: Metrics) -> WSGIServer:
    """A standalone worker's own /metrics on GATE_WORKER_METRICS_PORT, in a daemon thread.

    No token: it shows no project, gate or case names, only this process's durations and
    counts (bind it to an internal address with GATE_WORKER_METRICS_HOST)."""
    host, port = settings.worker_metrics_host, settings.worker_metrics_port
    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    log.info("worker metrics on http://%s:%s/metrics", host, port)
    return server


def _after_commit(session: Session, observe: Callable[[], None]) -> None:
    def fire(_session: Session) -> None:
        observe()

    event.listen(session, "after_commit", fire, once=True)

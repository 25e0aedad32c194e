"""Retention: what is older than its project's ``retention_days`` goes, in small batches.

A pass deletes, project by project, finished gates (status terminal) whose ``finished_at``
(or ``created_at`` when unset) is older than the project's retention, with their runs,
cases and jobs; then every bundle no gate references any more; then audit events older than
their project's retention (events with no project use the retention of ``default``).

Each batch is its own short transaction of at most ``GATE_RETENTION_BATCH_SIZE`` rows, so no
lock is held for long. Several workers may start a pass at once: a session advisory lock
lets one of them do it and the others skip, and every batch takes its rows with
``FOR UPDATE SKIP LOCKED`` and counts only what its own DELETE removed, so even passes that
overlapped would neither fail nor count a row twice. A queued or running gate is never
deleted, nor a gate whose job a live worker still holds, nor a bundle any gate references:
an upload in flight holds its bundle ``FOR KEY SHARE`` (see ``gates.lifecycle.create_gate``),
which the bundle batch skips.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from ..config import Settings
from ..db import session_scope
from ..models import DEFAULT_PROJECT, GateStatus, utcnow

log = logging.getLogger(__name__)

TERMINAL = sorted(s.value for s in GateStatus if s.terminal)
# pg advisory lock key of the retention pass ("gate-ret" as a signed 64-bit integer).
LOCK_KEY = int.from_bytes(b"gate-ret", "big", signed=True)
# Where bundles go in the report that no gate deleted in this pass referenced (left over
# by an earlier pass that stopped between its gate and bundle batches).
UNATTRIBUTED = "(earlier passes)"
DEFAULT_RETENTION_DAYS = 30


@dataclass
class Counts:
    """What one pass deleted for one project."""

    gates: int = 0
    result_bytes: int = 0  # the deleted gates' stored runs, freed from the project's quota
    cases: int = 0
    runs: int = 0
    bundles: int = 0
    bundle_bytes: int = 0
    audit_events: int = 0

    @property
    def empty(self) -> bool:
        return not (self.gates or self.cases or self.runs or self.bundles or self.audit_events)

    def add(self, other: Counts) -> None:
        self.gates += other.gates
        self.result_bytes += other.result_bytes
        self.cases += other.cases
        self.runs += other.runs
        self.bundles += other.bundles
        self.bundle_bytes += other.bundle_bytes
        self.audit_events += other.audit_events

    def describe(self) -> str:
        return (
            f"{self.gates} gates ({self.result_bytes} result bytes freed), {self.cases} cases, "
            f"{self.runs} runs, "
            f"{self.bundles} bundles ({self.bundle_bytes} bytes freed), "
            f"{self.audit_events} audit events"
        )


@dataclass
class RetentionReport:
    """Counts per project name; ``skipped`` when another process held the pass."""

    projects: dict[str, Counts] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: bool = False

    def of(self, project: str) -> Counts:
        return self.projects.setdefault(project, Counts())

    @property
    def total(self) -> Counts:
        total = Counts()
        for counts in self.projects.values():
            total.add(counts)
        return total

    def describe(self) -> str:
        return "; ".join(
            f"{name}: {counts.describe()}"
            for name, counts in sorted(self.projects.items())
            if not counts.empty
        )


class RetentionClock:
    """At most one pass per interval per process, however many worker threads ask."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: float | None = None

    def due(self, interval_s: float) -> bool:
        if interval_s <= 0:
            return False
        now = time.monotonic()
        with self._lock:
            if self._last is not None and now - self._last < interval_s:
                return False
            self._last = now
            return True


PROCESS_CLOCK = RetentionClock()


@contextmanager
def _pass_lock(sessions: sessionmaker[Session]) -> Iterator[bool]:
    """True while this process holds the pass; False when another one does."""
    engine = sessions.kw.get("bind")
    if not isinstance(engine, Engine):
        raise TypeError("the session factory must be bound to an Engine")
    # Autocommit: the lock is held by the connection, never by an open transaction.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        held = bool(conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}))
        try:
            yield held
        finally:
            if held:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})


def _gate_batch(
    session: Session, project_id: uuid.UUID, cutoff: datetime, limit: int
) -> tuple[int, Counts, list[str]]:
    """Delete up to ``limit`` expired gates of a project: (selected, counts, bundle shas)."""
    rows = session.execute(
        text(
            """
            SELECT g.id, g.bundle_sha256 FROM gates g
             WHERE g.project_id = :project AND g.status = ANY(:terminal)
               AND coalesce(g.finished_at, g.created_at) < :cutoff
               AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.gate_id = g.id
                                  AND j.state = 'running' AND j.lease_expires_at > now())
             ORDER BY g.created_at
             LIMIT :limit
               FOR UPDATE OF g SKIP LOCKED
            """
        ),
        {"project": project_id, "terminal": TERMINAL, "cutoff": cutoff, "limit": limit},
    ).all()
    if not rows:
        return 0, Counts(), []
    ids = [r.id for r in rows]
    counts = Counts()
    counts.runs = _rowcount(
        session,
        "DELETE FROM runs r USING cases c WHERE r.case_id = c.id AND c.gate_id = ANY(:ids)",
        ids,
    )
    counts.cases = _rowcount(session, "DELETE FROM cases WHERE gate_id = ANY(:ids)", ids)
    # The gates' jobs go with them (ON DELETE CASCADE).
    freed = session.execute(
        text("DELETE FROM gates WHERE id = ANY(:ids) RETURNING result_bytes"), {"ids": ids}
    ).all()
    counts.gates = len(freed)
    counts.result_bytes = sum(int(r.result_bytes) for r in freed)
    return len(rows), counts, [r.bundle_sha256 for r in rows]


def _rowcount(session: Session, sql: str, ids: list[uuid.UUID]) -> int:
    result = session.execute(text(sql), {"ids": ids})
    return int(result.rowcount)  # type: ignore[attr-defined]


def _bundle_batch(session: Session, limit: int) -> tuple[int, list[tuple[str, int]]]:
    """Delete up to ``limit`` bundles no gate references: (selected, [(sha256, bytes)])."""
    shas = list(
        session.scalars(
            text(
                """
                SELECT b.sha256 FROM bundles b
                 WHERE NOT EXISTS (SELECT 1 FROM gates g WHERE g.bundle_sha256 = b.sha256)
                 ORDER BY b.created_at
                 LIMIT :limit
                   FOR UPDATE OF b SKIP LOCKED
                """
            ),
            {"limit": limit},
        )
    )
    if not shas:
        return 0, []
    # Checked again under the lock, in this statement's newer snapshot: a gate that
    # committed meanwhile keeps its bundle.
    deleted = session.execute(
        text(
            """
            DELETE FROM bundles b
             WHERE b.sha256 = ANY(:shas)
               AND NOT EXISTS (SELECT 1 FROM gates g WHERE g.bundle_sha256 = b.sha256)
            RETURNING b.sha256, b.size_bytes
            """
        ),
        {"shas": shas},
    ).all()
    return len(shas), [(r.sha256, int(r.size_bytes)) for r in deleted]


def _audit_batch(
    session: Session, project_id: uuid.UUID | None, cutoff: datetime, limit: int
) -> tuple[int, int]:
    """Delete up to ``limit`` audit events older than ``cutoff``: (selected, deleted)."""
    scope = "project_id IS NULL" if project_id is None else "project_id = :project"
    ids = list(
        session.scalars(
            text(
                f"SELECT id FROM audit_events WHERE {scope} AND at < :cutoff "
                "ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED"
            ),
            {"project": project_id, "cutoff": cutoff, "limit": limit},
        )
    )
    if not ids:
        return 0, 0
    result = session.execute(text("DELETE FROM audit_events WHERE id = ANY(:ids)"), {"ids": ids})
    return len(ids), int(result.rowcount)  # type: ignore[attr-defined]


def _stopped(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


def _delete(
    sessions: sessionmaker[Session],
    settings: Settings,
    now: datetime,
    report: RetentionReport,
    stop: threading.Event | None,
) -> None:
    limit = settings.retention_batch_size
    with session_scope(sessions) as session:
        projects = session.execute(
            text("SELECT id, name, retention_days FROM projects ORDER BY name")
        ).all()
    released: dict[str, str] = {}  # bundle sha256 -> the project whose gate let it go
    default_days = DEFAULT_RETENTION_DAYS
    for project in projects:
        if project.name == DEFAULT_PROJECT:
            default_days = project.retention_days
        cutoff = now - timedelta(days=project.retention_days)
        counts = report.of(project.name)
        while not _stopped(stop):
            with session_scope(sessions) as session:
                selected, deleted, shas = _gate_batch(session, project.id, cutoff, limit)
            counts.add(deleted)
            for sha in shas:
                released.setdefault(sha, project.name)
            if selected < limit:
                break
        while not _stopped(stop):
            with session_scope(sessions) as session:
                selected, events = _audit_batch(session, project.id, cutoff, limit)
            counts.audit_events += events
            if selected < limit:
                break
    while not _stopped(stop):
        with session_scope(sessions) as session:
            selected, bundles = _bundle_batch(session, limit)
        for sha, size in bundles:
            counts = report.of(released.get(sha, UNATTRIBUTED))
            counts.bundles += 1
            counts.bundle_bytes += size
        if selected < limit:
            break
    cutoff = now - timedelta(days=default_days)
    while not _stopped(stop):
        with session_scope(sessions) as session:
            selected, events = _audit_batch(session, None, cutoff, limit)
        report.of(DEFAULT_PROJECT).audit_events += events
        if selected < limit:
            break


def run_retention(
    sessions: sessionmaker[Session],
    settings: Settings,
    *,
    now: datetime | None = None,
    stop: threading.Event | None = None,
    exclusive: bool = True,
) -> RetentionReport:
    """One retention pass; logs one INFO line with what it deleted (DEBUG when nothing).

    ``now`` is the moment ages are measured from (tests pass a later one). With
    ``exclusive`` the pass first takes a database-wide advisory lock and is skipped when
    another process holds it; without, it relies on SKIP LOCKED alone. ``stop`` ends the
    pass between two batches (shutdown).
    """
    now = now or utcnow()
    report = RetentionReport()
    started = time.monotonic()
    try:
        with _pass_lock(sessions) if exclusive else _no_lock() as held:
            if not held:
                report.skipped = True
                log.debug("retention: another process is doing a pass; skipped")
                return report
            _delete(sessions, settings, now, report, stop)
    except Exception:
        report.seconds = time.monotonic() - started
        log.error(
            "retention pass failed after %.2f s; deleted until then: %s",
            report.seconds,
            report.describe() or "nothing",
        )
        raise
    report.seconds = time.monotonic() - started
    if report.total.empty:
        log.debug("retention: nothing to delete (%.2f s)", report.seconds)
    else:
        log.info("retention pass deleted in %.2f s: %s", report.seconds, report.describe())
    return report


@contextmanager
def _no_lock() -> Iterator[bool]:
    yield True

"""Deleting a project with everything of it, in the caller's one transaction.

``delete_project`` is the one owner of what a deletion removes; it never commits (the
request's session does). What goes: the project's gates with their cases, runs, model calls
and jobs (a queued or running gate is stopped by its deletion, see below), its tokens and
their results-page sessions, its secrets, its quarantines, its model spending, its audit
events, the project row (its settings: retention, model routes, egress allowlist, API specs,
guardrail model, verdict rule),
and every bundle that only its gates referenced. What stays: one ``project.deleted`` audit
event under the deleting admin's project (`default`, which cannot be deleted), naming the
project and counting what went.

Stored bytes: a project's quotas are sums over its own rows (``admission``: its gates'
``result_bytes``, the bundles its gates reference), so they go with them. A bundle is stored
once per sha256 and may be shared by other projects' gates: only one no remaining gate
references is deleted, under the retention pass's protocol (locked ``SKIP LOCKED`` and
checked again in the deleting statement): one an upload holds (``FOR KEY SHARE``, see
``gates.lifecycle.create_gate``) is skipped, and the next retention pass deletes it if no gate
references it by then. Test images on the workers' engines are not the database's: image
GC (``worker/gc.py``) removes them as it removes any image no queued or running gate needs.

A queued or running gate is not waited for. Its job row goes with it, and every write of a
worker is fenced on that row (``jobs.ClaimedJob.fence``): once this transaction commits, the
worker's next write ends ``LeaseLost`` with nothing written, and its heartbeat (within
``worker.loop.CANCEL_CHECK_SECONDS``) finds the lease gone, halts the job and removes its
case containers, as for a cancel. The project's active jobs are locked before any row goes,
so no write of a worker is in flight while they go, and none starts until the deletion has
committed (it then finds nothing).

Locks: the project row first (``FOR UPDATE``: a submission in flight, which holds it
``FOR NO KEY UPDATE``, commits first and its gate is deleted too; later ones find no
project), then the active jobs. A deadlock with a writer that takes the same rows in
another order (an API cancel locks its gate before its job) rolls back only this
deletion's savepoint, and the deletion is tried again.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import asdict, dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ..auth.service import Principal, record, visible_project
from ..errors import Conflict, Forbidden, NotFound, ServiceUnavailable
from ..models import DEFAULT_PROJECT, GateStatus

log = logging.getLogger(__name__)

ACTIVE = sorted(s.value for s in GateStatus if not s.terminal)
DEADLOCK_DETECTED = "40P01"  # SQLSTATE
ATTEMPTS = 3


@dataclass
class DeletedCounts:
    """What a deletion removed: rows per kind, and the bytes its quotas counted."""

    gates: int = 0
    gates_stopped: int = 0  # of those, queued or running when the project was deleted
    cases: int = 0
    runs: int = 0
    model_calls: int = 0
    jobs: int = 0
    tokens: int = 0
    ui_sessions: int = 0
    secrets: int = 0
    quarantines: int = 0  # case_quarantines rows, held or ended
    spend_windows: int = 0  # project_model_spend rows
    audit_events: int = 0
    bundles: int = 0  # referenced by no other project's gate
    result_bytes: int = 0  # the gates' stored runs and model calls
    bundle_bytes: int = 0  # the deleted bundles' sizes


@dataclass(frozen=True)
class DeletedProject:
    id: uuid.UUID
    name: str
    counts: DeletedCounts


def delete_project(session: Session, who: Principal, name: str) -> DeletedProject:
    """Delete project ``name`` and everything of it (see the module's docstring), and audit
    it under the caller's project.

    Forbidden unless ``who`` is an admin of `default`; NotFound for an unknown project;
    Conflict for `default` itself; ServiceUnavailable when deadlocks made every attempt fail.
    """
    if not who.service_admin:
        raise Forbidden("only admin tokens of the 'default' project delete projects")
    project = visible_project(session, who, name)
    if project.name == DEFAULT_PROJECT:
        raise Conflict(
            f"the {DEFAULT_PROJECT!r} project cannot be deleted: its admin tokens administer "
            "the service"
        )
    project_id, project_name = project.id, project.name
    counts = _delete_with_retries(session, project_id, project_name)
    record(
        session,
        "project.deleted",
        project_id=who.project_id,
        token_id=who.token_id,
        detail={"project": project_name, "project_id": str(project_id), **asdict(counts)},
    )
    log.info("project %s (%s) deleted: %s", project_name, project_id, asdict(counts))
    return DeletedProject(project_id, project_name, counts)


def _delete_with_retries(session: Session, project_id: uuid.UUID, name: str) -> DeletedCounts:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            # A savepoint: a deadlock rolls back this attempt's deletes and locks only.
            with session.begin_nested():
                return _delete(session, project_id, name)
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            log.warning("deleting project %s: deadlock (attempt %s of %s)", name, attempt, ATTEMPTS)
    raise ServiceUnavailable(
        f"project {name!r} could not be deleted: its rows were in use (a deadlock, "
        f"{ATTEMPTS} times); nothing was deleted, try again"
    )


def _rows(session: Session, sql: str, params: dict[str, Any]) -> int:
    result = cast(CursorResult[Any], session.execute(text(sql), params))
    return int(result.rowcount)


def _delete(session: Session, project_id: uuid.UUID, name: str) -> DeletedCounts:
    p: dict[str, Any] = {"p": project_id}
    if session.execute(text("SELECT id FROM projects WHERE id = :p FOR UPDATE"), p).first() is None:
        raise NotFound(f"no project named {name!r}")  # deleted meanwhile
    # No write of a worker to these gates is in flight from here on, and none starts.
    session.execute(
        text(
            """
            SELECT j.id FROM jobs j JOIN gates g ON g.id = j.gate_id
             WHERE g.project_id = :p AND j.state IN ('queued', 'running')
             ORDER BY j.id
               FOR UPDATE OF j
            """
        ),
        p,
    ).all()
    counts = DeletedCounts()
    counts.gates_stopped = int(
        session.execute(
            text("SELECT count(*) FROM gates WHERE project_id = :p AND status = ANY(:active)"),
            {**p, "active": ACTIVE},
        ).scalar_one()
    )
    # Deepest first, so each count is its own table's (the foreign keys cascade too).
    counts.runs = _rows(
        session,
        "DELETE FROM runs r USING cases c, gates g "
        "WHERE r.case_id = c.id AND c.gate_id = g.id AND g.project_id = :p",
        p,
    )
    counts.model_calls = _rows(
        session,
        "DELETE FROM model_calls m USING gates g WHERE m.gate_id = g.id AND g.project_id = :p",
        p,
    )
    counts.cases = _rows(
        session, "DELETE FROM cases c USING gates g WHERE c.gate_id = g.id AND g.project_id = :p", p
    )
    counts.jobs = _rows(
        session, "DELETE FROM jobs j USING gates g WHERE j.gate_id = g.id AND g.project_id = :p", p
    )
    gates = session.execute(
        text("DELETE FROM gates WHERE project_id = :p RETURNING bundle_sha256, result_bytes"), p
    ).all()
    counts.gates = len(gates)
    counts.result_bytes = sum(int(g.result_bytes or 0) for g in gates)
    counts.bundles, counts.bundle_bytes = _delete_bundles(session, {g.bundle_sha256 for g in gates})
    counts.ui_sessions = _rows(
        session,
        "DELETE FROM ui_sessions s USING api_tokens t "
        "WHERE s.token_id = t.id AND t.project_id = :p",
        p,
    )
    counts.tokens = _rows(session, "DELETE FROM api_tokens WHERE project_id = :p", p)
    counts.secrets = _rows(session, "DELETE FROM project_secrets WHERE project_id = :p", p)
    counts.quarantines = _rows(session, "DELETE FROM case_quarantines WHERE project_id = :p", p)
    counts.spend_windows = _rows(
        session, "DELETE FROM project_model_spend WHERE project_id = :p", p
    )
    counts.audit_events = _rows(session, "DELETE FROM audit_events WHERE project_id = :p", p)
    session.execute(text("DELETE FROM projects WHERE id = :p"), p)
    return counts


def _delete_bundles(session: Session, shas: set[str]) -> tuple[int, int]:
    """Delete those of ``shas`` that no gate references any more: (bundles, bytes). As the
    retention pass does: one an upload holds (or another deleter) is skipped, and the
    reference is checked again in the deleting statement's snapshot."""
    if not shas:
        return 0, 0
    locked = list(
        session.scalars(
            text(
                """
                SELECT b.sha256 FROM bundles b
                 WHERE b.sha256 = ANY(:shas)
                   AND NOT EXISTS (SELECT 1 FROM gates g WHERE g.bundle_sha256 = b.sha256)
                 ORDER BY b.sha256
                   FOR UPDATE OF b SKIP LOCKED
                """
            ),
            {"shas": sorted(shas)},
        )
    )
    if not locked:
        return 0, 0
    deleted = session.execute(
        text(
            """
            DELETE FROM bundles b
             WHERE b.sha256 = ANY(:shas)
               AND NOT EXISTS (SELECT 1 FROM gates g WHERE g.bundle_sha256 = b.sha256)
            RETURNING b.size_bytes
            """
        ),
        {"shas": locked},
    ).all()
    return len(deleted), sum(int(d.size_bytes) for d in deleted)

"""The Postgres job queue: SKIP LOCKED claims under a lease, heartbeats, and a reaper.

Workers commit the claim at once and never hold a transaction across Docker work; every
later write re-checks the lease (``fence``) so a worker that lost its job cannot overwrite
the verdict of the worker that took it over.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..models import Job, JobState


@dataclass(frozen=True)
class ClaimedJob:
    id: int
    gate_id: uuid.UUID
    attempts: int
    owner: str
    # Set by the heartbeat when the gate is cancelled or the lease is lost: stop at once.
    halt: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


class LeaseLost(Exception):
    """Another worker owns the job now; stop working on it and write nothing."""


def enqueue(session: Session, gate_id: uuid.UUID) -> Job:
    job = Job(gate_id=gate_id, state=JobState.queued, attempts=0)
    session.add(job)
    return job


def drop_queued(session: Session, gate_id: uuid.UUID) -> None:
    """Take a gate's job off the queue if no worker has claimed it yet."""
    session.execute(
        text("UPDATE jobs SET state = 'done' WHERE gate_id = :g AND state = 'queued'"),
        {"g": gate_id},
    )


def claim(session: Session, *, owner: str, lease_seconds: int) -> ClaimedJob | None:
    row = session.execute(
        text(
            """
            UPDATE jobs SET state = 'running', lease_owner = :owner, attempts = attempts + 1,
                   lease_expires_at = now() + make_interval(secs => :lease)
             WHERE id = (SELECT id FROM jobs WHERE state = 'queued'
                          ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)
            RETURNING id, gate_id, attempts
            """
        ),
        {"owner": owner, "lease": lease_seconds},
    ).one_or_none()
    if row is None:
        return None
    return ClaimedJob(id=row.id, gate_id=row.gate_id, attempts=row.attempts, owner=owner)


def heartbeat(session: Session, job: ClaimedJob, *, lease_seconds: int) -> bool:
    row = session.execute(
        text(
            """
            UPDATE jobs SET lease_expires_at = now() + make_interval(secs => :lease)
             WHERE id = :id AND lease_owner = :owner AND state = 'running'
            RETURNING id
            """
        ),
        {"id": job.id, "owner": job.owner, "lease": lease_seconds},
    ).one_or_none()
    return row is not None


def active_owners(session: Session) -> set[str]:
    """Workers that hold a live lease right now."""
    rows = session.execute(
        text(
            "SELECT DISTINCT lease_owner FROM jobs "
            "WHERE state = 'running' AND lease_owner IS NOT NULL"
        )
    ).scalars()
    return set(rows)


def cancel_requested(session: Session, job: ClaimedJob) -> bool:
    return bool(
        session.execute(
            text("SELECT cancel_requested FROM gates WHERE id = :g"), {"g": job.gate_id}
        ).scalar()
    )


def fence(session: Session, job: ClaimedJob) -> None:
    """Lock our job row and make sure we still own it; call first in every write."""
    row = session.execute(
        text(
            "SELECT id FROM jobs WHERE id = :id AND lease_owner = :owner AND state = 'running' "
            "FOR UPDATE"
        ),
        {"id": job.id, "owner": job.owner},
    ).one_or_none()
    if row is None:
        raise LeaseLost(f"job {job.id} is no longer owned by {job.owner}")


def finish(session: Session, job: ClaimedJob, *, error: str | None = None) -> None:
    fence(session, job)
    session.execute(
        text(
            "UPDATE jobs SET state = 'done', lease_owner = NULL, lease_expires_at = NULL, "
            "last_error = :error WHERE id = :id"
        ),
        {"id": job.id, "error": error},
    )


def release(session: Session, job: ClaimedJob, *, error: str, refund: bool = False) -> None:
    """Give the job back to the queue; ``refund`` when the attempt was not the job's fault
    (a worker shutting down), so rolling restarts do not use up its attempts."""
    fence(session, job)
    session.execute(
        text(
            "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
            "last_error = :error, attempts = attempts - :refund WHERE id = :id"
        ),
        {"id": job.id, "error": error, "refund": 1 if refund else 0},
    )


@dataclass(frozen=True)
class ExpiredJob:
    id: int
    gate_id: uuid.UUID
    attempts: int
    owner: str | None
    last_error: str | None


def take_expired(session: Session) -> list[ExpiredJob]:
    """Jobs whose worker stopped renewing its lease (crashed, killed, partitioned)."""
    rows = session.execute(
        text(
            """
            SELECT id, gate_id, attempts, lease_owner, last_error FROM jobs
             WHERE state = 'running' AND lease_expires_at < now()
             FOR UPDATE SKIP LOCKED
            """
        )
    ).all()
    return [ExpiredJob(r.id, r.gate_id, r.attempts, r.lease_owner, r.last_error) for r in rows]


def requeue_expired(session: Session, job_id: int, *, note: str) -> None:
    session.execute(
        text(
            "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
            "last_error = :note WHERE id = :id"
        ),
        {"id": job_id, "note": note},
    )


def close_expired(session: Session, job_id: int, *, note: str) -> None:
    session.execute(
        text(
            "UPDATE jobs SET state = 'done', lease_owner = NULL, lease_expires_at = NULL, "
            "last_error = :note WHERE id = :id"
        ),
        {"id": job_id, "note": note},
    )

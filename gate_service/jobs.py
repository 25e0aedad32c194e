"""The Postgres job queue: SKIP LOCKED claims under a lease, heartbeats, and a reaper.

Both sides import it: the API enqueues (a gate and its job in one transaction) and drops a
queued job on cancel; workers claim, fence, finish and release. It imports neither side.

Workers commit the claim at once and never hold a transaction across Docker work. A claimed
job carries its lease: every later write goes through ``ClaimedJob.transaction``, which
re-checks the lease first (``fence``), so a worker that lost its job cannot overwrite the
verdict of the worker that took it over.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.orm import Session, sessionmaker

from .db import session_scope
from .models import Job, JobState


class LeaseLost(Exception):
    """Another worker owns the job now; stop working on it and write nothing."""


# The lease's proof, first in every write of a job (built once: it is on every case's path).
_FENCE = text(
    "SELECT id FROM jobs WHERE id = :id AND lease_owner = :owner AND state = 'running' FOR UPDATE"
)


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds under a lease, and the writes that lease allows."""

    id: int
    gate_id: uuid.UUID
    attempts: int
    owner: str
    project_id: uuid.UUID | None = None  # the gate's project (a worker's fair shares)
    # Set by the heartbeat when the gate is cancelled or the lease is lost: stop at once.
    halt: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    @contextmanager
    def transaction(self, sessions: sessionmaker[Session]) -> Iterator[Session]:
        """One transaction that first proves the lease is still ours (LeaseLost if not)."""
        with session_scope(sessions) as session:
            self.fence(session)
            yield session

    def fence(self, session: Session) -> None:
        """Lock our job row and make sure we still own it; call first in every write."""
        row = session.execute(_FENCE, {"id": self.id, "owner": self.owner}).one_or_none()
        if row is None:
            raise LeaseLost(f"job {self.id} is no longer owned by {self.owner}")

    def finish(self, session: Session, *, error: str | None = None) -> None:
        """The job is done (its gate has its verdict); ``error`` is kept as its last error."""
        self.fence(session)
        session.execute(
            text(
                "UPDATE jobs SET state = 'done', lease_owner = NULL, lease_expires_at = NULL, "
                "last_error = :error WHERE id = :id"
            ),
            {"id": self.id, "error": error},
        )

    def release(self, session: Session, *, error: str, refund: bool = False) -> None:
        """Give the job back to the queue; ``refund`` when the attempt was not the job's
        fault (a worker shutting down), so rolling restarts do not use up its attempts."""
        self.fence(session)
        session.execute(
            text(
                "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
                "last_error = :error, attempts = attempts - :refund WHERE id = :id"
            ),
            {"id": self.id, "error": error, "refund": 1 if refund else 0},
        )

    def heartbeat(self, session: Session, *, lease_seconds: int) -> bool:
        """Renew the lease; False when it is no longer ours."""
        row = session.execute(
            text(
                """
                UPDATE jobs SET lease_expires_at = now() + make_interval(secs => :lease)
                 WHERE id = :id AND lease_owner = :owner AND state = 'running'
                RETURNING id
                """
            ),
            {"id": self.id, "owner": self.owner, "lease": lease_seconds},
        ).one_or_none()
        return row is not None

    def gone(self, session: Session) -> bool:
        """Whether the job's row is no more: its gate was deleted with its project
        (projects/deletion.py). Its lease is lost for good then, and there is nothing to write."""
        return not session.execute(
            text("SELECT EXISTS (SELECT 1 FROM jobs WHERE id = :id)"), {"id": self.id}
        ).scalar()

    def cancel_requested(self, session: Session) -> bool:
        return bool(
            session.execute(
                text("SELECT cancel_requested FROM gates WHERE id = :g"), {"g": self.gate_id}
            ).scalar()
        )


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


def claim(
    session: Session,
    *,
    owner: str,
    lease_seconds: int,
    max_running_per_project: int | None = None,
    exclude_projects: Collection[uuid.UUID] = (),
) -> ClaimedJob | None:
    """A queued job, leased to ``owner``; None when there is none to take.

    Claims go round-robin across projects (see ``_FAIR_ORDER``): the oldest queued job of
    the project served least recently, so one project's burst does not starve the others.
    With ``max_running_per_project``, a job whose project already has that many running jobs
    is left queued (another project's is taken instead), so one project cannot hold every
    worker. Jobs of ``exclude_projects`` are not taken (those holding their share of the
    worker, see loop.py).
    """
    skip_projects = [str(p) for p in exclude_projects]
    if max_running_per_project is not None:
        return _claim_capped(
            session,
            owner=owner,
            lease_seconds=lease_seconds,
            cap=max_running_per_project,
            exclude_projects=skip_projects,
        )
    row = session.execute(
        text(
            """
            UPDATE jobs SET state = 'running', lease_owner = :owner, attempts = attempts + 1,
                   lease_expires_at = now() + make_interval(secs => :lease)
             WHERE id = (SELECT j.id FROM jobs j JOIN gates g ON g.id = j.gate_id
                          WHERE j.state = 'queued'
                            AND NOT (g.project_id = ANY(CAST(:projects AS uuid[])))
                          ORDER BY """
            + _FAIR_ORDER
            + """ FOR UPDATE OF j SKIP LOCKED LIMIT 1)
            """
            + _RETURNING_CLAIM
        ),
        {"owner": owner, "lease": lease_seconds, "projects": skip_projects},
    ).one_or_none()
    return None if row is None else _claimed(row, owner)


# What a claim's UPDATE of the job returns: the ClaimedJob (``_claimed``), its gate's project
# with it.
_RETURNING_CLAIM = """
    RETURNING id, gate_id, attempts,
              (SELECT project_id FROM gates WHERE gates.id = jobs.gate_id) AS project_id
"""


def _claimed(row: Row[Any], owner: str) -> ClaimedJob:
    return ClaimedJob(
        id=row.id,
        gate_id=row.gate_id,
        attempts=row.attempts,
        owner=owner,
        project_id=row.project_id,
    )


# Round-robin across projects: a queued job of the project served least recently first
# (never served: first of all), then the oldest. A project was last served when its newest
# gate started, or now if it has a claimed job whose gate has not started yet (a claim
# commits before the worker starts the gate). Derived from the gates so that no claim has
# to write a shared row; a retry's claim does not count as a new turn.
_FAIR_ORDER = """
    (SELECT max(CASE WHEN sj.state = 'running' AND sg.started_at IS NULL THEN now()
                     ELSE sg.started_at END)
       FROM gates sg LEFT JOIN jobs sj ON sj.gate_id = sg.id
      WHERE sg.project_id = g.project_id) ASC NULLS FIRST,
    j.id
"""

_RUNNING_OF_PROJECT = """
    SELECT count(*) FROM jobs r JOIN gates rg ON rg.id = r.gate_id
     WHERE r.state = 'running' AND rg.project_id = {project}
"""


def _claim_capped(
    session: Session,
    *,
    owner: str,
    lease_seconds: int,
    cap: int,
    exclude_projects: list[str],
) -> ClaimedJob | None:
    """Claim under a per-project cap on running jobs, exactly.

    The candidate query skips projects at their cap, but two workers can see the same last
    free place at once; so the claimer then locks the project row (``FOR NO KEY UPDATE``,
    the lock submissions take too) and counts again. Claims of one project are thereby
    serialised and the count is exact: only a claim makes a job running, and the previous
    claimer committed before it let go of the lock. Each try runs in a savepoint; a lost
    race rolls it back, which releases the job and project locks before the next try, so a
    claimer never waits for a project while holding another project's lock (no deadlock).
    The fair order (``_FAIR_ORDER``) only chooses which candidate to try first; the cap's
    exactness rests on the lock and the recount alone.
    """
    # Projects left out: those found at their cap during this claim, and the caller's.
    full: list[str] = list(exclude_projects)
    while True:
        attempt = session.begin_nested()
        try:
            row = session.execute(
                text(
                    """
                    SELECT j.id, g.project_id FROM jobs j JOIN gates g ON g.id = j.gate_id
                     WHERE j.state = 'queued'
                       AND NOT (g.project_id = ANY(CAST(:full AS uuid[])))
                       AND ("""
                    + _RUNNING_OF_PROJECT.format(project="g.project_id")
                    + """) < :cap
                     ORDER BY """
                    + _FAIR_ORDER
                    + """ FOR UPDATE OF j SKIP LOCKED LIMIT 1
                    """
                ),
                {"full": full, "cap": cap},
            ).one_or_none()
            if row is None:
                attempt.rollback()
                return None
            session.execute(
                text("SELECT id FROM projects WHERE id = :p FOR NO KEY UPDATE"),
                {"p": row.project_id},
            )
            running = session.execute(
                text(_RUNNING_OF_PROJECT.format(project=":p")), {"p": row.project_id}
            ).scalar_one()
            if running >= cap:  # another worker took the last place first
                attempt.rollback()
                full.append(str(row.project_id))
                continue
            claimed = session.execute(
                text(
                    """
                    UPDATE jobs SET state = 'running', lease_owner = :owner,
                           attempts = attempts + 1,
                           lease_expires_at = now() + make_interval(secs => :lease)
                     WHERE id = :id
                    """
                    + _RETURNING_CLAIM
                ),
                {"id": row.id, "owner": owner, "lease": lease_seconds},
            ).one()
            attempt.commit()
        except BaseException:
            if attempt.is_active:
                attempt.rollback()
            raise
        return _claimed(claimed, owner)


def keeps_container(session: Session, gate_id: str | None, owner: str | None) -> bool:
    """Whether a case container labelled with ``gate_id`` and ``owner`` must stay, in one query.

    It stays when its gate is not in this database (several installations, or test runs, may
    share one Docker engine, and another's containers are never ours to judge), and while
    ``owner`` holds an unexpired lease on that gate's job. Once the gate is finished, or the
    lease has expired (the job goes back to the queue), it is an orphan, even if its worker
    is alive and holds other jobs.
    """
    try:
        parsed = uuid.UUID(gate_id or "")
    except ValueError:
        return True  # no gate of ours names it
    row = session.execute(
        text(
            "SELECT NOT EXISTS (SELECT 1 FROM gates WHERE id = :g) "
            "    OR EXISTS (SELECT 1 FROM jobs WHERE gate_id = :g AND lease_owner = :owner "
            "               AND state = 'running' AND lease_expires_at > now())"
        ),
        {"g": parsed, "owner": owner},
    ).scalar()
    return bool(row)


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

"""Admission control: caps that answer at once instead of letting one client exhaust the service.

- per API process: concurrent uploads and long-polls (``Slots``, built in the app's lifespan),
  and each project's share of them;
- per project at submission: queued gates, stored bundle bytes and stored result bytes
  (``admit_submission``);
- for the whole service: queued gates (``admit_submission``);
- per project in the worker: running gates (``jobs.claim``), and a fair share of
  each worker's gate places and case slots (``worker.slots``);
- per gate in the worker: cases and a deadline (``worker.handler``).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Hashable, Iterator
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.orm import Session

from .config import Settings
from .errors import NotFound, ServiceUnavailable, TooManyRequests

# What a refused client is told to wait before trying again.
QUEUE_RETRY_AFTER_SECONDS = 30
BUSY_RETRY_AFTER_SECONDS = 2


class Slots:
    """A counter of requests in progress in this process, with a share per project; full
    means an answer now, never a wait.

    Nothing is queued in memory: a request either takes a slot at once or is refused. A
    project may hold at most ``per_project`` of the ``capacity`` slots (the request is
    refused 429 past it), so no one project can take them all and make every other
    project's requests answer 503: what one project holds, it holds of its own share.
    """

    def __init__(
        self,
        capacity: int,
        what: str,
        setting: str,
        *,
        per_project: int | None = None,
        per_project_setting: str = "",
    ) -> None:
        self.capacity, self.what, self.setting = capacity, what, setting
        self.per_project = min(capacity, fair_share(capacity, per_project))
        self.per_project_setting = per_project_setting
        self._in_use = 0
        self._held: Counter[Hashable] = Counter()
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        return self._in_use

    def held_by(self, project: Hashable) -> int:
        return self._held[project]

    def try_acquire(self, project: Hashable) -> bool:
        return self._take(project) is None

    def _take(self, project: Hashable) -> str | None:
        """None when a slot was taken for ``project``; else what is full: "project" or "all"."""
        with self._lock:
            if self._held[project] >= self.per_project:
                return "project"
            if self._in_use >= self.capacity:
                return "all"
            self._in_use += 1
            self._held[project] += 1
            return None

    def release(self, project: Hashable) -> None:
        with self._lock:
            if self._held[project] <= 0:
                return
            self._held[project] -= 1
            if not self._held[project]:
                del self._held[project]  # the counter never grows with every project seen
            self._in_use -= 1

    @contextmanager
    def hold(self, project: Hashable, project_name: str) -> Iterator[None]:
        """One slot of ``project``'s for the block.

        TooManyRequests (429, Retry-After) when the project holds its share already;
        ServiceUnavailable (503, Retry-After) when every slot of the process is in use.
        """
        full = self._take(project)
        if full == "project":
            raise TooManyRequests(
                f"project {project_name!r} already has {self.per_project} {self.what} in "
                f"progress on this server, its share of the {self.capacity} "
                f"({self.per_project_setting}); try again once one of them ends",
                retry_after_s=BUSY_RETRY_AFTER_SECONDS,
            )
        if full == "all":
            raise ServiceUnavailable(
                f"this server is already handling {self.capacity} {self.what} (the limit, "
                f"{self.setting}); try again shortly",
                retry_after_s=BUSY_RETRY_AFTER_SECONDS,
            )
        try:
            yield
        finally:
            self.release(project)


def fair_share(capacity: int, setting: int | None) -> int:
    """A project's share of ``capacity`` slots: the setting, or by default half of them (at
    least one), so one project alone can never hold every slot while another comes."""
    return setting if setting is not None else max(1, capacity // 2)


def queued_gates(session: Session, project_id: uuid.UUID | None = None) -> int:
    """Gates waiting for a worker (their job is queued), of one project or of all."""
    if project_id is None:
        return int(
            session.execute(text("SELECT count(*) FROM jobs WHERE state = 'queued'")).scalar_one()
        )
    return int(
        session.execute(
            text(
                "SELECT count(*) FROM jobs JOIN gates ON gates.id = jobs.gate_id "
                "WHERE jobs.state = 'queued' AND gates.project_id = :p"
            ),
            {"p": project_id},
        ).scalar_one()
    )


def stored_bundle_bytes(session: Session, project_id: uuid.UUID) -> tuple[int, set[str]]:
    """Bytes of the distinct bundles the project's gates reference, and their hashes.

    Bundles are stored once per sha256 and may be shared by projects; each project is
    charged for every bundle its gates reference, so sharing gains nobody extra room.
    """
    rows = session.execute(
        text(
            "SELECT sha256, size_bytes FROM bundles WHERE sha256 IN "
            "(SELECT DISTINCT bundle_sha256 FROM gates WHERE project_id = :p)"
        ),
        {"p": project_id},
    ).all()
    return sum(int(r.size_bytes) for r in rows), {str(r.sha256) for r in rows}


def stored_result_bytes(session: Session, project_id: uuid.UUID) -> int:
    """Bytes the project's runs store (each gate keeps the sum of its runs' stored_bytes)."""
    return int(
        session.execute(
            text("SELECT coalesce(sum(result_bytes), 0) FROM gates WHERE project_id = :p"),
            {"p": project_id},
        ).scalar_one()
    )


def lock_project(session: Session, project_id: uuid.UUID) -> None:
    """Serialise admission decisions for one project until the transaction ends.

    ``FOR NO KEY UPDATE`` conflicts with itself, not with the ``FOR KEY SHARE`` that inserting
    a gate (its foreign key) takes, so it orders submissions and worker claims of the same
    project without blocking anything else.
    """
    locked = session.execute(
        text("SELECT id FROM projects WHERE id = :p FOR NO KEY UPDATE"), {"p": project_id}
    ).first()
    if locked is None:  # deleted (projects/deletion.py) since the caller's token was checked
        raise NotFound(f"project {project_id} was deleted")


def admit_submission(
    session: Session,
    settings: Settings,
    *,
    project_id: uuid.UUID,
    project_name: str,
    sha256: str,
    size_bytes: int,
) -> None:
    """Refuse a new gate over the project's or the service's caps; call after lock_project.

    Counted in the transaction that inserts the gate. The per-project caps are exact: every
    submission of the project holds its row lock (``lock_project``) from the count to the
    commit, so the next one counts after this one's insert is visible. The global queue cap
    takes no global lock (that would serialise every project's submissions): submissions of
    different projects that count at the same moment can each see room, so the queue can
    overshoot ``max_queued_gates`` by at most the number of submissions in flight at once
    (itself bounded by GATE_MAX_CONCURRENT_UPLOADS per API process).
    """
    queued = queued_gates(session, project_id)
    cap = settings.max_queued_gates_per_project
    if queued >= cap:
        raise TooManyRequests(
            f"project {project_name!r} already has {queued} gates waiting for a worker; the "
            f"limit is {cap} (GATE_MAX_QUEUED_GATES_PER_PROJECT). Wait for some to finish",
            retry_after_s=QUEUE_RETRY_AFTER_SECONDS,
        )
    stored, hashes = stored_bundle_bytes(session, project_id)
    if sha256 not in hashes:
        limit = settings.max_bundle_bytes_per_project
        if stored + size_bytes > limit:
            raise TooManyRequests(
                f"project {project_name!r} stores {stored} bytes of bundles; this one's "
                f"{size_bytes} bytes would pass the limit of {limit} bytes "
                "(GATE_MAX_BUNDLE_BYTES_PER_PROJECT). Retention frees space as old gates are "
                "deleted; resubmitting a bundle already stored costs nothing"
            )
    results = stored_result_bytes(session, project_id)
    if results >= settings.max_result_bytes_per_project:
        raise TooManyRequests(
            f"project {project_name!r} stores {results} bytes of run results; the limit is "
            f"{settings.max_result_bytes_per_project} bytes "
            "(GATE_MAX_RESULT_BYTES_PER_PROJECT). Retention frees space as old gates are "
            "deleted (the project's retention_days)"
        )
    total = queued_gates(session)
    if total >= settings.max_queued_gates:
        raise ServiceUnavailable(
            f"the service already has {total} gates waiting for a worker; the limit is "
            f"{settings.max_queued_gates} (GATE_MAX_QUEUED_GATES). Try again later",
            retry_after_s=QUEUE_RETRY_AFTER_SECONDS,
        )

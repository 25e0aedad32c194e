"""The worker loop: reap expired leases, claim a job, heartbeat while judging it."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping

from .. import jobs
from ..db import session_scope
from ..gates import lifecycle
from ..jobs import ClaimedJob
from ..logs import bind_log_context, log_context
from ..models import GateStatus
from ..sandbox import build_step_expired
from .gc import collect_if_due
from .handler import WorkerContext, judge_gate
from .retention import PROCESS_CLOCK, RetentionClock, run_retention
from .slots import CaseSlots, next_place_claim
from .wakeup import STOP_CHECK_SECONDS

log = logging.getLogger(__name__)
REAP_EVERY_SECONDS = 10.0
CANCEL_CHECK_SECONDS = 2.0


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    def __init__(
        self,
        ctx: WorkerContext,
        name: str | None = None,
        retention_clock: RetentionClock = PROCESS_CLOCK,
    ) -> None:
        self.ctx = ctx
        self.name = name or worker_name()
        self._last_reap = -math.inf  # the first housekeeping reaps, however young the clock
        # The case containers this worker runs at once, shared by every gate it holds.
        self.slots = CaseSlots(ctx.settings.case_concurrency)
        self.containers = CaseSlots(ctx.settings.case_container_limit(ctx.sandbox.runtime))
        # Shared by every worker of the process: one retention pass per interval per process.
        self.retention_clock = retention_clock
        self.idle = threading.Event()  # set while it waits for work (for tests)
        # Set once run() has begun: its start logged, orphans reaped (`gate serve` shows a
        # first start's token after its workers have started).
        self.started = threading.Event()

    def run(self) -> None:
        """Work until ctx.stop is set; the job in hand is finished or handed back first."""
        bind_log_context(worker=self.name)  # this thread's records carry the worker's name
        log.info("worker %s started", self.name)
        # The start's housekeeping (orphans and expired leases reaped, a due retention pass,
        # scratch collected) before started: once /readyz counts this worker, its first
        # claim waits for nothing (issue 43).
        self._housekeeping()
        self.started.set()
        poll = self.ctx.settings.worker_poll_seconds
        with self._woken_by_jobs() as wake:
            while not self.ctx.stop.is_set():
                wake.clear()  # before the claim: a job queued during it wakes the wait below
                try:
                    worked = self.run_once()
                except Exception:
                    log.exception("worker %s: unexpected error; backing off", self.name)
                    self.ctx.stop.wait(poll)  # a back-off, whatever the queue does meanwhile
                    continue
                if not worked:
                    self.idle.set()
                    self._wait_for_work(wake, poll)
                    self.idle.clear()
        log.info("worker %s stopped", self.name)

    def _wait_for_work(self, wake: threading.Event, seconds: float) -> None:
        """Until a job may be claimable (``wake``, set through the process's LISTEN), stop,
        or ``seconds`` pass: the poll interval bounds the wait if a notification is missed.
        Waited in slices that look at stop, so stop is never waited out whatever the poll."""
        if self.ctx.jobs is None:
            self.ctx.stop.wait(seconds)
            return
        deadline = time.monotonic() + seconds
        while not self.ctx.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or wake.wait(min(left, STOP_CHECK_SECONDS)):
                return

    @contextlib.contextmanager
    def _woken_by_jobs(self) -> Iterator[threading.Event]:
        """An event set whenever a job may have become claimable (see wakeup.py)."""
        event = threading.Event()
        if self.ctx.jobs is None:
            yield event
            return
        with self.ctx.jobs.subscribe(event):
            yield event

    def run_once(self) -> bool:
        """Claim a job and judge it, with the others this worker takes meanwhile (see
        ``_judge_held``); False when the queue was empty."""
        self._housekeeping()
        job = self._claim()
        if job is None:
            return False
        self._judge_held(job)
        return True

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_reap >= REAP_EVERY_SECONDS:
            self._last_reap = now
            self.reap_expired()
            self.reap_orphans()
        if self.retention_clock.due(self.ctx.settings.retention_interval_seconds):
            self.retain()
        # Here, not only in run_once: under steady load one run_once can last for hours.
        collect_if_due(self.ctx)  # scratch at the start, images each GATE_GC_INTERVAL_SECONDS

    def _claim(self, exclude_projects: Collection[uuid.UUID | None] = ()) -> ClaimedJob | None:
        with session_scope(self.ctx.sessions) as session:
            return jobs.claim(
                session,
                owner=self.name,
                lease_seconds=self.ctx.settings.job_lease_seconds,
                max_running_per_project=self.ctx.settings.max_running_gates_per_project,
                exclude_projects=[p for p in exclude_projects if p is not None],
            )

    def _claim_fairly(
        self, holding: Mapping[threading.Thread, uuid.UUID | None]
    ) -> ClaimedJob | None:
        """One more gate for this worker, by the place rule of slots.py: of a project under
        its share of GATE_WORKER_GATES first (past them too, up to the overdraft), then, while
        a place is free, of any project."""
        claim = next_place_claim(Counter(holding.values()), self.ctx.settings.worker_gates)
        if claim is None:
            return None
        job = self._claim(exclude_projects=claim.exclude)
        if job is None and claim.fallback and claim.exclude:
            job = self._claim()
        return job

    def _judge_held(self, first: ClaimedJob) -> None:
        """Judge ``first``, holding more jobs while any taken here runs: up to
        GATE_WORKER_GATES, and past them for a project under its fair share (slots.py).

        Each held job is judged in its own thread, under its own lease and heartbeat (so
        fencing, cancel, deadlines and retries are each job's own, as with one); their cases
        share this worker's case slots, by project and then round-robin by gate (slots.py),
        so a small gate taken next to a large one is not stuck behind it, nor one project's
        gate behind another's. More jobs are claimed at once and then whenever one ends, one
        is queued, or every GATE_WORKER_POLL_SECONDS, under the same fair order and
        per-project cap as any claim. Returns once every job taken here is finished or
        handed back. A job handed back for a retry is queued again at once, and may be taken
        again here in the same call: it does not wait behind the jobs still held.
        """
        with self._woken_by_jobs() as changed:
            self._hold_more(first, changed)

    def _hold_more(self, first: ClaimedJob, changed: threading.Event) -> None:
        """``_judge_held``'s loop; ``changed`` is set when a held job ends or one is queued."""
        holding: dict[threading.Thread, uuid.UUID | None] = {}  # each held job's project
        ended: set[threading.Thread] = set()  # a thread is still alive when it says it ended

        def hold(job: ClaimedJob) -> None:
            def judge() -> None:
                try:
                    self._judge_one(job)
                except Exception:
                    log.exception("worker %s: judging gate %s failed", self.name, job.gate_id)
                finally:
                    ended.add(threading.current_thread())
                    changed.set()

            thread = threading.Thread(target=judge, name=f"job-{job.id}", daemon=True)
            holding[thread] = job.project_id
            try:
                thread.start()
            except BaseException:
                del holding[thread]  # never started, so it never ends: not held
                raise

        hold(first)
        while True:
            changed.clear()
            for thread in ended & holding.keys():
                del holding[thread]
            if not holding:
                return
            # The database (or the engine) failing here must not end this call while jobs are
            # held: their threads go on, each under its own lease, and returning would let the
            # caller claim past GATE_WORKER_GATES beside them. Each is tried at the next wake.
            try:
                self._housekeeping()
            except Exception:
                log.exception("worker %s: housekeeping failed; the held jobs go on", self.name)
            try:
                while not self.ctx.stop.is_set():
                    job = self._claim_fairly(holding)
                    if job is None:
                        break
                    hold(job)
            except Exception:
                log.exception(
                    "worker %s: claiming more jobs failed; the held ones go on", self.name
                )
            changed.wait(self.ctx.settings.worker_poll_seconds)

    def _judge_one(self, job: ClaimedJob) -> None:
        """Judge one job to its end, with a heartbeat renewing its lease meanwhile."""
        # Every record about the job carries its gate and this worker (the heartbeat's too).
        with log_context(worker=self.name, gate_id=job.gate_id):
            log.info("worker %s judging gate %s (attempt %s)", self.name, job.gate_id, job.attempts)
            done = threading.Event()
            beat = threading.Thread(
                target=contextvars.copy_context().run,
                args=(self._heartbeat, job, done),
                daemon=True,
            )
            beat.start()
            try:
                judge_gate(self.ctx, job, self.slots, self.containers)
            finally:
                done.set()
                beat.join()

    def _heartbeat(self, job: ClaimedJob, done: threading.Event) -> None:
        lease = self.ctx.settings.job_lease_seconds
        # Beat often enough to renew the lease and to notice a cancel within seconds.
        while not done.wait(min(lease / 3, CANCEL_CHECK_SECONDS)):
            try:
                with session_scope(self.ctx.sessions) as session:
                    owned = job.heartbeat(session, lease_seconds=lease)
                    cancelled = job.cancel_requested(session)
            except Exception:
                log.exception("job %s: heartbeat failed; will retry", job.id)
                continue
            if not owned or cancelled:
                why = "the gate was cancelled" if owned else "the lease was lost"
                log.warning("job %s: %s; stopping its containers", job.id, why)
                job.halt.set()
                # Only this worker's containers of the gate: after a lost lease, the worker
                # that took the job over may run the gate's cases on this same engine.
                self._reap({"gate.gate_id": str(job.gate_id), "gate.owner": job.owner})
                return

    def _reap(
        self, labels: dict[str, str], keep: Callable[[Mapping[str, str]], bool] | None = None
    ) -> None:
        try:
            removed = self.ctx.sandbox.reap(labels, keep=keep)
        except Exception:
            log.exception("removing containers %s failed", labels)
            return
        self.ctx.metrics.containers_reaped(removed)
        if removed:
            log.info("removed %s container(s) %s", removed, labels or "left by dead workers")

    def retain(self) -> None:
        """One retention pass (see retention.py); a failure is logged and tried next interval."""
        try:
            run_retention(self.ctx.sessions, self.ctx.settings, stop=self.ctx.stop)
        except Exception:
            log.exception("worker %s: the retention pass failed", self.name)

    def reap_orphans(self) -> None:
        """Remove case containers that no worker is judging any more: their gate is
        finished, or their worker's lease on its job expired (it crashed, or lost the job).

        A container is kept while the worker named by its label holds a live lease on the
        job of its gate, so no worker removes another live worker's cases. Only containers
        of this database's gates: several installations (or test runs) may share one Docker
        engine, and another's containers are never ours to judge. A test-image build's step
        container is an orphan once the deadline on its label has passed (its worker died
        during the build). Runs at the worker's start and every REAP_EVERY_SECONDS.
        """
        now = time.time()
        # One query per gate and owner in a pass, not one per container: a running gate's
        # cases (up to the worker's container slots) all carry the same two labels.
        kept: dict[tuple[str | None, str | None], bool] = {}
        with session_scope(self.ctx.sessions) as session:

            def keep(labels: Mapping[str, str]) -> bool:
                if build_step_expired(labels, now):  # its worker died during the build
                    return False
                key = (labels.get("gate.gate_id"), labels.get("gate.owner"))
                if key not in kept:
                    kept[key] = jobs.keeps_container(session, *key)
                return kept[key]

            self._reap({}, keep=keep)

    def reap_expired(self) -> None:
        """Requeue jobs of dead workers, or end their gates once attempts are used up."""
        max_attempts = self.ctx.settings.job_max_attempts
        with session_scope(self.ctx.sessions) as session:
            for expired in jobs.take_expired(session):
                note = f"the lease of worker {expired.owner} expired"
                if expired.attempts < max_attempts:
                    log.warning("job %s: %s; requeueing", expired.id, note)
                    jobs.requeue_expired(session, expired.id, note=note)
                    continue
                jobs.close_expired(session, expired.id, note=note)
                gate = lifecycle.get_gate(session, expired.gate_id, for_update=True)
                if GateStatus(gate.status).terminal:  # e.g. cancelled meanwhile: keep it
                    continue
                lifecycle.fail_gate(
                    gate,
                    reason=f"no worker finished the gate in {expired.attempts} attempt(s); "
                    f"last: {note}" + (f" ({expired.last_error})" if expired.last_error else ""),
                )
                self.ctx.metrics.gate_finished(session, gate)

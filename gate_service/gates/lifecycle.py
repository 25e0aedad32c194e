"""Every write of a gate's and its cases' state, from creation to the verdict.

The worker's only way into ``gates``: starting, phases, failing, cancelling, its cases'
rows, each case's mark and stored outcome, the verdict; and the few reads it needs (the
bundle's bytes, the gate it locks, its cases still to judge, a run's storage cap). The API
creates and cancels gates here through ``submission``; its HTTP modules never import this
module (an import-linter contract), and ``views`` answers every read.

Functions take the session first and never commit: the request or the job owns the
transaction. Every visible change bumps ``Gate.revision``, which the ETag and long-poll use.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import IO, Any, NamedTuple, cast

from sqlalchemy import (
    Boolean,
    Integer,
    Table,
    and_,
    bindparam,
    delete,
    false,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gate_runner.contract import CaseResult, Invocation

from .. import jobs
from ..admission import admit_submission, lock_project, stored_result_bytes
from ..baselines.closure import Closure, case_key
from ..baselines.figures import runs_done
from ..baselines.judging import regression_reason
from ..bundles.archive import Manifest
from ..bundles.suites import CaseRef
from ..config import Settings
from ..errors import Conflict, NotFound
from ..models import (
    BUNDLE_CHUNK_BYTES,
    Bundle,
    BundleChunk,
    Case,
    CaseStatus,
    Gate,
    GateStatus,
    Phase,
    Run,
    utcnow,
)
from ..results import contract_types
from ..runner_contract import UntrustedResult
from ..stored_runs import (
    MIN_STORED_RUN_BYTES,
    PackedRun,
    RunCap,
    cut_text,
    json_bytes,
    pack_run,
    storable,
    storable_text,
    stored_columns,
)
from .model_calls import save_model_calls as save_model_calls  # the worker stores calls here

# A case's own failure_reason (the runner's sentence on its first failed run) is kept to this;
# the runs hold the rest, under their own cap.
MAX_CASE_REASON_BYTES = 16 * 1024
# A case in any other status was not judged, and fails its gate closed (finish_gate).
JUDGED_CASE_STATUSES = (CaseStatus.passed, CaseStatus.failed, CaseStatus.error)
STATUS_CHARS = 32  # Run.status is String(32); the runner's status words are shorter


def write_bundle(session: Session, sha256: str, bundle: IO[bytes]) -> None:
    """The bundle's bytes from its file, a chunk at a time (memory stays flat)."""
    bundle.seek(0)
    seq = 0
    while chunk := bundle.read(BUNDLE_CHUNK_BYTES):
        session.execute(insert(BundleChunk).values(sha256=sha256, seq=seq, data=chunk))
        seq += 1


def read_bundle(session: Session, sha256: str) -> Iterator[bytes]:
    """A stored bundle's bytes, a chunk at a time: fetched in order, each held only while it
    is written out."""
    seqs = session.scalars(
        select(BundleChunk.seq).where(BundleChunk.sha256 == sha256).order_by(BundleChunk.seq)
    ).all()
    for seq in seqs:
        yield session.scalars(
            select(BundleChunk.data).where(BundleChunk.sha256 == sha256, BundleChunk.seq == seq)
        ).one()


def create_gate(
    session: Session,
    caps: Settings,
    *,
    project_id: uuid.UUID,
    project_name: str,
    sha256: str,
    bundle: IO[bytes],
    size_bytes: int,
    manifest: Manifest,
    name_filter: str | None,
    model_mode: str | None = None,
    labels: dict[str, Any],
    idempotency_key: str | None,
    baseline: str | None = None,
    changed_only: bool = False,
) -> tuple[Gate, bool]:
    """Store the bundle (once per hash), the gate and its job; returns (gate, created).

    A new gate over the admission caps of ``caps`` is refused (429/503); a repeated
    idempotency key still finds its gate, whatever the queue holds now.
    """
    lock_project(session, project_id)  # held to the commit: the project's caps are exact
    if idempotency_key:
        existing = session.scalar(
            select(Gate)
            .where(Gate.project_id == project_id)
            .where(Gate.idempotency_key == idempotency_key)
        )
        if existing is not None:
            if existing.bundle_sha256 != sha256:
                raise Conflict(
                    f"Idempotency-Key {idempotency_key!r} was used for a different bundle "
                    f"(gate {existing.id})"
                )
            return existing, False
    admit_submission(
        session,
        caps,
        project_id=project_id,
        project_name=project_name,
        sha256=sha256,
        size_bytes=size_bytes,
    )
    store_bundle = (
        insert(Bundle)
        .values(
            sha256=sha256,
            archive_format=manifest.archive_format,
            size_bytes=size_bytes,
            code_bytes=manifest.code_bytes,
            fixture_bytes=manifest.fixture_bytes,
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["sha256"])
        .returning(Bundle.sha256)
    )

    def store() -> None:
        # Its bytes only with a new row: a bundle already stored (or being stored by a
        # concurrent upload, whose insert this one waited for) has them.
        if session.execute(store_bundle).first() is not None:
            write_bundle(session, sha256, bundle)

    store()
    # The retention pass deletes bundles no gate references, and skips locked ones: hold
    # this one (FOR KEY SHARE) until the gate referencing it commits. A pass that deleted
    # it in between leaves no row to lock: store it again.
    keep = (
        select(Bundle.sha256)
        .where(Bundle.sha256 == sha256)
        .with_for_update(read=True, key_share=True)
    )
    for _ in range(3):
        if session.scalar(keep) is not None:
            break
        store()
    gate = Gate(
        project_id=project_id,
        bundle_sha256=sha256,
        filter=name_filter or None,
        model_mode=model_mode or None,
        labels=labels,
        idempotency_key=idempotency_key,
        baseline=baseline,
        changed_only=changed_only,
        status=GateStatus.queued,
        phase=Phase.queued,
        problems=[],
        revision=0,
        created_at=utcnow(),
    )
    session.add(gate)
    session.flush()
    jobs.enqueue(session, gate.id)
    session.flush()
    return gate, True


def get_gate(
    session: Session,
    gate_id: uuid.UUID,
    *,
    project_id: uuid.UUID | None = None,
    for_update: bool = False,
) -> Gate:
    """The gate; with ``project_id``, only that project's (another project's is 404)."""
    stmt = select(Gate).where(Gate.id == gate_id)
    if project_id is not None:
        stmt = stmt.where(Gate.project_id == project_id)
    if for_update:
        stmt = stmt.with_for_update()
    gate = session.scalar(stmt)
    if gate is None:
        raise NotFound(f"no gate with id {gate_id}")
    return gate


def request_cancel(session: Session, gate_id: uuid.UUID, project_id: uuid.UUID) -> Gate:
    """Cancel a queued gate at once; a running one stops before its next case."""
    gate = get_gate(session, gate_id, project_id=project_id, for_update=True)
    if GateStatus(gate.status).terminal:
        raise Conflict(f"gate {gate_id} has already ended with status {gate.status}")
    gate.cancel_requested = True
    if gate.status == GateStatus.queued:
        _end(gate, GateStatus.cancelled, phase=Phase.done, reason="cancelled before it started")
        jobs.drop_queued(session, gate.id)
    gate.revision += 1
    return gate


# -- the worker's side -------------------------------------------------------------------


def _end(gate: Gate, status: GateStatus, *, phase: Phase, reason: str | None) -> None:
    gate.status = status
    gate.phase = phase
    gate.failure_reason = reason
    gate.finished_at = utcnow()
    gate.revision += 1


def start_gate(gate: Gate, sandbox: dict[str, str] | None = None) -> None:
    """The gate runs; ``sandbox`` says what runs its cases (backend and runtime)."""
    if sandbox is not None:
        gate.sandbox = sandbox
    gate.status = GateStatus.running
    gate.phase = Phase.validating
    gate.started_at = gate.started_at or utcnow()
    gate.revision += 1


def set_phase(gate: Gate, phase: Phase) -> None:
    gate.phase = phase
    gate.revision += 1


def fail_gate(
    gate: Gate, *, reason: str, problems: Sequence[dict[str, Any]] = (), error: str | None = None
) -> None:
    """End the gate `error`: it could not be judged. The phase stays where it stopped."""
    phase = Phase(gate.phase) if gate.phase != Phase.queued else Phase.validating
    # Problems quote the bundle's own text, which may hold NUL or a lone surrogate: Postgres
    # can store neither.
    reason = storable_text(reason)
    _end(gate, GateStatus.error, phase=phase, reason=reason)
    gate.error = storable_text(error) if error else reason
    gate.problems = storable(list(problems))


def cancel_gate(gate: Gate) -> None:
    _end(gate, GateStatus.cancelled, phase=Phase.done, reason="cancelled on request")


def record_warnings(gate: Gate, warnings: Sequence[dict[str, Any]]) -> None:
    """What the gate's agents use that it does not honour as the platform would."""
    gate.warnings = storable(list(warnings))


def record_model_modes(gate: Gate, modes: Mapping[str, str], reason: str | None) -> None:
    """Each LLM agent's model mode as validating worked it out (bundles/live_models.py
    ``agent_modes``), and why when none was forced (``mode_reason``)."""
    gate.model_modes = storable(dict(modes))
    gate.model_mode_reason = storable_text(reason) if reason is not None else None


def close_unjudged(session: Session, gate: Gate, reason: str) -> None:
    """Cases that never ran (the gate ended first) say so instead of staying queued."""
    for case in session.scalars(
        select(Case)
        .where(Case.gate_id == gate.id)
        .where(Case.status.in_([CaseStatus.queued, CaseStatus.running]))
    ):
        case.status = CaseStatus.cancelled
        case.failure_reason = reason
    gate.revision += 1


def save_cases(
    session: Session,
    gate: Gate,
    refs: Sequence[CaseRef],
    closures: Sequence[Closure] | None = None,
) -> list[Case]:
    """Create the gate's case rows once; a retried job finds and keeps them. ``closures``:
    each case's closure and definition hashes (baselines/closure.py), in ``refs``' order."""
    existing = {
        (c.suite, c.test_name): c
        for c in session.scalars(select(Case).where(Case.gate_id == gate.id))
    }
    cases = []
    for position, ref in enumerate(refs):
        case = existing.get((ref.suite, ref.test_name))
        if case is None:
            case = Case(
                gate_id=gate.id,
                position=position,
                suite=ref.suite,
                agent_name=ref.agent_name,
                test_name=ref.test_name,
                status=CaseStatus.queued,
                runs=ref.runs,
                success_threshold=ref.success_threshold,
                timeout_s=ref.timeout_s,
                successes=0,
                case_key=case_key(ref.suite, ref.agent_name, ref.test_name),
                closure_hash=closures[position].closure if closures is not None else None,
                definition_hash=closures[position].definition if closures is not None else None,
            )
            session.add(case)
        cases.append(case)
    gate.revision += 1
    session.flush()
    return cases


def reuse_case(case: Case, base: Case, why: str) -> None:
    """Report ``case`` as its baseline's passing ``base`` instead of running it (an
    incremental gate, baselines/judging.py ``reusable_cases``): its counts, a link, why."""
    ran = runs_done(base)
    case.status = CaseStatus.passed
    case.passed = True
    case.successes = base.successes
    case.invocations_run = ran
    case.stopped_early = base.stopped_early
    case.duration_ms = 0
    case.failure_reason = None
    case.reused_from = base.id
    case.regression_level = "none"
    case.baseline = {
        "gate_id": str(base.gate_id),
        "case_id": str(base.id),
        "successes": base.successes,
        "runs": ran,
        "comparable": True,
        "why": why,
        "p_value": None,
        "drop_points": 0.0,
    }


class PendingCase(NamedTuple):
    """A case still to judge: what its container is made with and its outcome judged by."""

    id: uuid.UUID
    suite: str
    test_name: str
    runs: int
    success_threshold: int
    timeout_s: int


def unjudged_cases(session: Session, gate_id: uuid.UUID) -> list[PendingCase]:
    """The gate's cases still queued or running, in order: what an attempt (a retry resumes
    where the last one stopped) has left to judge."""
    return [
        PendingCase(c.id, c.suite, c.test_name, c.runs, c.success_threshold, c.timeout_s)
        for c in session.scalars(
            select(Case)
            .where(Case.gate_id == gate_id)
            .where(Case.status.in_([CaseStatus.queued, CaseStatus.running]))
            .order_by(Case.position)
        )
    ]


def run_cap(session: Session, settings: Settings, project_id: uuid.UUID) -> RunCap:
    """What one run of the project may store now: GATE_MAX_STORED_RUN_BYTES, or only
    MIN_STORED_RUN_BYTES once the project's stored results reached its quota (gates admitted
    before it was reached still finish, each run at that floor)."""
    quota = settings.max_result_bytes_per_project
    used = stored_result_bytes(session, project_id)
    if used >= quota:
        return RunCap(
            MIN_STORED_RUN_BYTES,
            f"the project's runs already store {used} bytes, its limit "
            f"(GATE_MAX_RESULT_BYTES_PER_PROJECT = {quota}), so a run stores at most "
            f"{MIN_STORED_RUN_BYTES} bytes until retention frees space",
        )
    return RunCap.setting(settings.max_stored_run_bytes, "GATE_MAX_STORED_RUN_BYTES")


# A case's store runs on every case's path: its statements are built once, on the tables
# (plain Core, none of the ORM's per-statement work), and their compiled forms are cached.
# The ORM's loads and flush had been most of the store's CPU.
_GATES, _CASES, _RUNS = (cast(Table, m.__table__) for m in (Gate, Case, Run))
_LOCK_GATE = (
    select(_GATES.c.project_id).where(_GATES.c.id == bindparam("gate_id")).with_for_update()
)
_DELETE_RUNS = (
    delete(_RUNS).where(_RUNS.c.case_id == bindparam("case_id")).returning(_RUNS.c.stored_bytes)
)
_INSERT_RUN = _RUNS.insert()
# A judged case stores the worker's verdict and every other field of the runner's result the
# cases table has a column for, as the result holds it (duration_ms, and a field added to the
# contract and the table); the suite's own fields were stored when the case was created.
_FROM_SUITE = frozenset({"suite", "test_name", "agent_name", "runs", "success_threshold"})
_VERDICT = ("status", "passed", "successes", "failure_reason")
FROM_RESULT = tuple(
    name
    for name in contract_types(CaseResult)
    if name in _CASES.c and name not in _FROM_SUITE and name not in _VERDICT
)
_CASE_VERDICT = (
    update(_CASES)
    .where(_CASES.c.id == bindparam("case_id"))
    .values(
        {
            **{name: bindparam(name) for name in (*_VERDICT, *FROM_RESULT)},
            # No contract's fields: the invocations the result holds, and whether that is
            # fewer than the case's runs (as the suite the worker validated says) because the
            # runner stopped early; a case left unjudged (error) never stopped early.
            "invocations_run": bindparam("invocations_run", type_=Integer),
            "stopped_early": func.coalesce(
                and_(
                    bindparam("judged", type_=Boolean),
                    bindparam("invocations_run", type_=Integer) < _CASES.c.runs,
                ),
                false(),
            ),
        }
    )
)
_COUNT_CASE_WRITE = (
    update(_GATES)
    .where(_GATES.c.id == bindparam("gate_id"))
    .values(
        revision=_GATES.c.revision + 1,
        result_bytes=func.coalesce(_GATES.c.result_bytes, 0) + bindparam("stored_bytes"),
    )
)


# Marking a case running is on every case's path too, in the same style.
_MARK_GATE = (
    update(_GATES)
    .where(_GATES.c.id == bindparam("gate_id"), _GATES.c.cancel_requested.is_(False))
    .values(revision=_GATES.c.revision + 1)
    .returning(_GATES.c.started_at)
)
_MARK_CASE = (
    update(_CASES)
    .where(_CASES.c.id == bindparam("case_id"))
    .values(status=CaseStatus.running.value)
)


class CaseStart(NamedTuple):
    """What the gate said when one of its cases was about to start (``mark_gate_for_case``)."""

    cancelled: bool  # asked to cancel: nothing was written, and the case must not start
    started_at: datetime | None  # where the gate's deadline counts from


def mark_gate_for_case(session: Session, gate_id: uuid.UUID) -> CaseStart:
    """Bump the gate's revision for a case about to start, locking its row first as every
    write of one of its cases does; unless the gate was asked to cancel, when nothing is
    written. Either way, when the gate started: the caller checks its deadline before
    ``mark_case_running`` (a raise then rolls the revision back). NotFound when it is gone."""
    marked = session.execute(_MARK_GATE, {"gate_id": gate_id}).one_or_none()
    if marked is None:  # cancelled: nothing is marked, the start read all the same
        return CaseStart(cancelled=True, started_at=get_gate(session, gate_id).started_at)
    return CaseStart(cancelled=False, started_at=marked.started_at)


def mark_case_running(session: Session, case_id: uuid.UUID) -> None:
    """The case is running, after ``mark_gate_for_case`` in the same transaction."""
    session.execute(_MARK_CASE, {"case_id": case_id})


def lock_gate_for_case_write(session: Session, gate_id: uuid.UUID) -> uuid.UUID:
    """Lock the gate's row, first in every write of one of its cases (so two writers of one
    gate take their locks in one order), and return its project; NotFound when it is gone."""
    project_id = session.execute(_LOCK_GATE, {"gate_id": gate_id}).scalar_one_or_none()
    if project_id is None:
        raise NotFound(f"no gate with id {gate_id}")
    return project_id  # type: ignore[no-any-return]


def save_case_result(
    session: Session,
    case_id: uuid.UUID,
    result: CaseResult,
    cap: RunCap,
    *,
    status: CaseStatus,
    successes: int,
    passed: bool | None,
) -> int:
    """Store a judged case with its verdict (decided by worker/outcome.py from the suite the
    worker validated, never from the result's own) and each invocation, within ``cap``: the
    change in the bytes its runs store, for ``count_case_write``.

    UntrustedResult when the result nests too deeply to store; nothing is changed then.
    """
    try:
        packed = [(inv, pack_run(inv.as_dict(), cap)) for inv in result.invocations]
    except RecursionError:
        raise UntrustedResult("the result nests too deeply to store") from None
    # What an earlier result of the case stored, removed and counted in one statement.
    replaced = int(sum(session.execute(_DELETE_RUNS, {"case_id": case_id}).scalars()))
    _set_verdict(
        session,
        case_id,
        status=status,
        passed=passed,
        successes=successes,
        reason=result.failure_reason,
        from_result={name: getattr(result, name) for name in FROM_RESULT},
        invocations_run=len(result.invocations),
    )
    if packed:
        session.execute(_INSERT_RUN, [_run_row(case_id, inv, run) for inv, run in packed])
    return sum(run.stored_bytes for _, run in packed) - replaced


def _set_verdict(
    session: Session,
    case_id: uuid.UUID,
    *,
    status: CaseStatus,
    passed: bool | None,
    successes: int,
    reason: str | None,
    from_result: Mapping[str, Any],
    invocations_run: int | None = None,
) -> None:
    """``from_result``: the FROM_RESULT fields, each None when there was no result;
    ``invocations_run``: the invocations the result holds (None: no result), from which the
    statement decides ``stopped_early`` for a judged case."""
    carried = {k: storable(v) for k, v in from_result.items()}
    session.execute(
        _CASE_VERDICT,
        {
            **dict.fromkeys(FROM_RESULT),
            **carried,
            "case_id": case_id,
            "status": CaseStatus(status).value,
            "passed": passed,
            "successes": successes,
            "failure_reason": _case_reason(reason),
            "invocations_run": invocations_run,
            "judged": passed is not None,
        },
    )


def _case_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    reason = storable_text(reason)
    if json_bytes(reason) <= MAX_CASE_REASON_BYTES:
        return reason
    return cut_text(reason, MAX_CASE_REASON_BYTES - 64)


def _run_row(case_id: uuid.UUID, inv: Invocation, run: PackedRun) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "case_id": case_id,
        **stored_columns(inv, run),
        "status": storable_text(inv.status)[:STATUS_CHARS],
    }


def save_case_outcome(
    session: Session,
    case_id: uuid.UUID,
    *,
    status: CaseStatus,
    reason: str,
    duration_ms: int | None = None,
) -> None:
    """A case the runner could not report on: failed (the bundle's fault) or error (ours).
    Its runs (none, unless an earlier attempt stored some) are left as they are."""
    _set_verdict(
        session,
        case_id,
        status=status,
        passed=False if status == CaseStatus.failed else None,
        successes=0,
        reason=reason,
        from_result={"duration_ms": duration_ms},
    )


def count_case_write(session: Session, gate_id: uuid.UUID, stored_bytes: int) -> None:
    """The gate's revision bumped (its pollers see the change) and ``stored_bytes`` (what the
    case's write added to what the gate stores, less what it replaced) counted in."""
    session.execute(_COUNT_CASE_WRITE, {"gate_id": gate_id, "stored_bytes": stored_bytes})


def finish_gate(session: Session, gate: Gate) -> None:
    """Decide the verdict from the cases, failing closed.

    A gate passes only when it has at least one case and every case passed. A case that
    could not be judged (`error`), or one in any state but passed or failed (`queued`,
    `running`, `cancelled`, or a status this code does not know) ends the gate `error`,
    naming the first such case; else a failed case ends it `failed`, unless it ran under a
    quarantine, and so does a case that regressed against the gate's baseline (even when
    every threshold held; baselines/judging.py stored both on the cases).
    """
    cases = session.scalars(
        select(Case).where(Case.gate_id == gate.id).order_by(Case.position)
    ).all()
    if not cases:
        reason = "the gate has no cases, so nothing was judged"
        _end(gate, GateStatus.error, phase=Phase.done, reason=reason)
        gate.error = reason
        return
    errored = [c for c in cases if c.status == CaseStatus.error]
    unsettled = [c for c in cases if c.status not in JUDGED_CASE_STATUSES]
    failed = [c for c in cases if c.status == CaseStatus.failed]
    # A quarantined case's failure or regression is reported, and does not fail the gate.
    failing = [c for c in failed if not c.quarantine]
    regressed = [c for c in cases if c.regression_level == "regression" and not c.quarantine]
    if errored or unsettled:
        first = errored[0] if errored else unsettled[0]
        count = len(errored) + len(unsettled)
        why = (
            first.failure_reason
            if first.status == CaseStatus.error
            else f"it was never judged (its status is {first.status!r})"
        )
        reason = (
            f"{count} of {len(cases)} case(s) could not be judged; "
            f"{first.suite}::{first.test_name}: {why}"
        )
        _end(gate, GateStatus.error, phase=Phase.done, reason=reason)
        gate.error = reason
    elif failing or regressed:
        parts = []
        if failing:
            first = failing[0]
            parts.append(
                f"{len(failing)} of {len(cases)} case(s) failed; "
                f"{first.agent_name}::{first.test_name}: {first.failure_reason}"
            )
        if regressed:
            parts.append(
                f"{len(regressed)} case(s) regressed against the baseline; "
                + regression_reason(regressed[0])
            )
        _end(gate, GateStatus.failed, phase=Phase.done, reason="; and ".join(parts))
    else:
        _end(gate, GateStatus.passed, phase=Phase.done, reason=None)

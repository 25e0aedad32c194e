"""Gate lifecycle: creation with its job, reads, cancellation, and the worker's state changes.

Functions take the session first and never commit: the request or the job owns the
transaction. Every visible change bumps ``Gate.revision``, which the ETag and long-poll use.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, cast

from sqlalchemy import Table, bindparam, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gate_runner.contract import CaseResult, Invocation

from .. import jobs
from ..admission import admit_submission, lock_project, stored_result_bytes
from ..bundles.archive import Manifest
from ..bundles.suites import CaseRef
from ..config import Settings
from ..errors import Conflict, NotFound
from ..links import gate_html_url
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
    unpack,
)
from .model_calls import model_call_totals, read_recordings
from .model_calls import save_model_calls as save_model_calls  # the worker stores calls here
from .schemas import (
    BundleRead,
    CaseRead,
    GateList,
    GateRead,
    GateSummary,
    ModelCallTotals,
    RecordingsRead,
    RunRead,
)

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


def gate_revision(session: Session, gate_id: uuid.UUID, project_id: uuid.UUID) -> int:
    rev = session.scalar(
        select(Gate.revision).where(Gate.id == gate_id).where(Gate.project_id == project_id)
    )
    if rev is None:
        raise NotFound(f"no gate with id {gate_id}")
    return rev


def read_gate(
    session: Session,
    gate_id: uuid.UUID,
    project_id: uuid.UUID,
    *,
    public_url: str = "",
    cases_limit: int | None = None,
) -> GateRead:
    """``public_url``: GATE_PUBLIC_URL, which html_url is absolute under (a path when empty).
    ``cases_limit``: at most this many cases, the rest a page away (None: all of them)."""
    return read_gate_view(
        session, gate_id, project_id, public_url=public_url, cases_limit=cases_limit
    )[1]


def read_gate_body(
    session: Session,
    gate_id: uuid.UUID,
    project_id: uuid.UUID,
    *,
    public_url: str = "",
    cases_limit: int | None = None,
) -> tuple[int, bytes]:
    """The gate's revision and its JSON body (what GET answers), from five queries."""
    revision, view = read_gate_view(
        session, gate_id, project_id, public_url=public_url, cases_limit=cases_limit
    )
    return revision, view.model_dump_json().encode()


# GET /v1/gates/{id} answers this many cases by default (?cases_limit), the rest a page away
# (GET /v1/gates/{id}/cases): what a poll reads and serialises stays the same at 500 cases.
CASES_PAGE = 100
MAX_CASES_PAGE = 1000


def cases_path(gate_id: uuid.UUID, after: int, limit: int) -> str:
    """The REST path of the gate's cases after position ``after`` (a page's `next`)."""
    return f"/v1/gates/{gate_id}/cases?after={after}&limit={limit}"


def read_case_views(
    session: Session,
    gate_id: uuid.UUID,
    *,
    after: int = -1,
    limit: int | None = None,
    calls_by_case: Mapping[uuid.UUID, ModelCallTotals] | None = None,
) -> tuple[list[CaseRead], str | None]:
    """The gate's cases after position ``after`` in order, at most ``limit`` (None: all), and
    the path of the page after them (None when these are the last). Three queries, whatever
    the gate's size: a page costs what its own cases cost."""
    query = (
        select(Case).where(Case.gate_id == gate_id, Case.position > after).order_by(Case.position)
    )
    cases = list(session.scalars(query if limit is None else query.limit(limit + 1)).all())
    following = None
    if limit is not None and len(cases) > limit:
        cases = cases[:limit]
        # A body with no cases (cases_limit=0) points at the first page of the default size.
        following = cases_path(gate_id, cases[-1].position if cases else after, limit or CASES_PAGE)
    runs_by_case: dict[uuid.UUID, list[tuple[uuid.UUID, bool]]] = {c.id: [] for c in cases}
    if cases:
        rows = session.execute(
            select(Run.case_id, Run.id, Run.passed)
            .where(Run.case_id.in_([c.id for c in cases]))
            .order_by(Run.case_id, Run.index)
        ).all()
        for case_id, run_id, passed in rows:
            runs_by_case[case_id].append((run_id, passed))
    if calls_by_case is None:  # a page alone: its own cases' calls
        ids = [c.id for c in cases]
        calls_by_case = model_call_totals(session, gate_id, ids)[1] if cases else {}
    none = ModelCallTotals()
    views = [
        CaseRead(
            id=c.id,
            suite=c.suite,
            agent_name=c.agent_name,
            test_name=c.test_name,
            status=c.status,
            passed=c.passed,
            successes=c.successes,
            runs=c.runs,
            success_threshold=c.success_threshold,
            duration_ms=c.duration_ms,
            failure_reason=c.failure_reason,
            agent_run_ids=[r for r, _ in runs_by_case[c.id]],
            agent_run_passed=[p for _, p in runs_by_case[c.id]],
            model_calls=calls_by_case.get(c.id, none),
        )
        for c in cases
    ]
    return views, following


def read_gate_view(
    session: Session,
    gate_id: uuid.UUID,
    project_id: uuid.UUID,
    *,
    public_url: str = "",
    cases_limit: int | None = None,
) -> tuple[int, GateRead]:
    """The gate's revision and its view, read in one go (the results page's ETag and body).

    With ``cases_limit``, the view holds the first cases only and ``next_cases`` the path of
    the rest: a poll of a 500-case gate then costs what a poll of a small one does. The
    counts are always the whole gate's.
    """
    # The gate and its bundle in one query, then the case counts, then a page of cases (see
    # read_case_views), then the model calls' totals.
    row = session.execute(
        select(Gate, Bundle)
        .join(Bundle, Bundle.sha256 == Gate.bundle_sha256)
        .where(Gate.id == gate_id)
        .where(Gate.project_id == project_id)
    ).first()
    if row is None:
        raise NotFound(f"no gate with id {gate_id}")
    gate, bundle = row
    total, passed, failed, judged = session.execute(
        select(
            func.count(),
            func.count().filter(Case.passed.is_(True)),
            func.count().filter(Case.status == CaseStatus.failed),
            func.count().filter(Case.status.not_in([CaseStatus.queued, CaseStatus.running])),
        ).where(Case.gate_id == gate.id)
    ).one()
    calls, calls_by_case = model_call_totals(session, gate.id)
    case_views, following = read_case_views(
        session, gate.id, limit=cases_limit, calls_by_case=calls_by_case
    )
    return gate.revision, GateRead(
        id=gate.id,
        status=gate.status,
        phase=gate.phase,
        created_at=gate.created_at,
        started_at=gate.started_at,
        finished_at=gate.finished_at,
        filter=gate.filter,
        model_mode=effective_model_mode(gate),
        requested_model_mode=gate.model_mode,
        model_modes=gate.model_modes or {},
        model_mode_reason=gate.model_mode_reason,
        labels=gate.labels,
        bundle=BundleRead.model_validate(bundle),
        total_cases=total,
        passed_cases=passed,
        failed_cases=failed,
        judged_cases=judged,
        error=gate.error,
        failure_reason=gate.failure_reason,
        problems=gate.problems,
        warnings=gate.warnings,
        model_calls=calls,
        cases=case_views,
        next_cases=following,
        html_url=gate_html_url(public_url, gate.id),
    )


def gate_recordings(session: Session, gate_id: uuid.UUID, project_id: uuid.UUID) -> RecordingsRead:
    """The gate's answered model calls as replay recordings; another project's gate is 404."""
    return read_recordings(session, get_gate(session, gate_id, project_id=project_id))


def list_gates(
    session: Session,
    *,
    project_id: uuid.UUID,
    status: str | None,
    label: dict[str, str] | None,
    limit: int,
    offset: int,
    public_url: str = "",
) -> GateList:
    stmt = select(Gate).where(Gate.project_id == project_id)
    if status:
        stmt = stmt.where(Gate.status == status)
    if label:
        stmt = stmt.where(Gate.labels.contains(label))
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    gates = session.scalars(stmt.order_by(Gate.created_at.desc()).limit(limit).offset(offset)).all()
    return GateList(
        items=[
            GateSummary.model_validate(g).model_copy(
                update={"html_url": gate_html_url(public_url, g.id)}
            )
            for g in gates
        ],
        total=total,
        limit=limit,
        offset=offset,
    )


def get_run(session: Session, run_id: uuid.UUID, project_id: uuid.UUID) -> Run:
    run = session.scalar(
        select(Run)
        .join(Case, Case.id == Run.case_id)
        .join(Gate, Gate.id == Case.gate_id)
        .where(Run.id == run_id)
        .where(Gate.project_id == project_id)
    )
    if run is None:
        raise NotFound(f"no run with id {run_id}")
    return run


def read_run(session: Session, run_id: uuid.UUID, project_id: uuid.UUID) -> RunRead:
    """The run as the API answers it: every shared value back in each place it stood."""
    return _run_view(get_run(session, run_id, project_id))


def get_case(session: Session, case_id: uuid.UUID, project_id: uuid.UUID) -> Case:
    """The case; another project's is 404."""
    case = session.scalar(
        select(Case)
        .join(Gate, Gate.id == Case.gate_id)
        .where(Case.id == case_id)
        .where(Gate.project_id == project_id)
    )
    if case is None:
        raise NotFound(f"no case with id {case_id}")
    return case


def read_case_runs(session: Session, case: Case) -> list[RunRead]:
    """Every invocation of the case, in order, as read_run answers each."""
    runs = session.scalars(select(Run).where(Run.case_id == case.id).order_by(Run.index)).all()
    return [_run_view(run) for run in runs]


def _run_view(run: Run) -> RunRead:
    shared = run.shared_values or {}
    return RunRead(
        id=run.id,
        case_id=run.case_id,
        index=run.index,
        status=run.status,
        passed=run.passed,
        input=unpack(run.input, shared),
        output=unpack(run.output, shared),
        error=run.error,
        failure_reason=run.failure_reason,
        failed_assertions=unpack(run.failed_assertions, shared),
        run_context=unpack(run.run_context, shared),
        duration_ms=run.duration_ms,
        traces=unpack(run.traces, shared),
    )


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


def start_gate(gate: Gate) -> None:
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


# The gate's model_mode before validating worked its agents' modes out (none forced).
PENDING_MODE = "pending"
# No LLM agent ran in any mode: the selected cases reach none, or the gate ended before its
# agents' modes were worked out.
NO_MODE = "none"
# LLM agents that ran in different modes.
MIXED_MODE = "mixed"


def effective_model_mode(gate: Gate) -> str:
    """The mode the gate's LLM agents ran in, never null: the forced one; else the one mode
    of every agent in ``model_modes``, or ``mixed``; else ``none`` once validating is over
    (a reason is stored) or the gate has ended, ``pending`` before."""
    if gate.model_mode:
        return gate.model_mode
    modes = set((gate.model_modes or {}).values())
    if len(modes) == 1:
        return modes.pop()
    if modes:
        return MIXED_MODE
    if gate.model_mode_reason is not None or GateStatus(gate.status).terminal:
        return NO_MODE
    return PENDING_MODE


def save_cases(session: Session, gate: Gate, refs: Sequence[CaseRef]) -> list[Case]:
    """Create the gate's case rows once; a retried job finds and keeps them."""
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
            )
            session.add(case)
        cases.append(case)
    gate.revision += 1
    session.flush()
    return cases


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
_CASE_VERDICT = (
    update(_CASES)
    .where(_CASES.c.id == bindparam("case_id"))
    .values(
        status=bindparam("status"),
        passed=bindparam("passed"),
        successes=bindparam("successes"),
        duration_ms=bindparam("duration_ms"),
        failure_reason=bindparam("failure_reason"),
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
        duration_ms=result.duration_ms,
        reason=result.failure_reason,
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
    duration_ms: int | None,
    reason: str | None,
) -> None:
    session.execute(
        _CASE_VERDICT,
        {
            "case_id": case_id,
            "status": CaseStatus(status).value,
            "passed": passed,
            "successes": successes,
            "duration_ms": duration_ms,
            "failure_reason": _case_reason(reason),
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
        "index": inv.index,
        "status": storable_text(inv.status)[:STATUS_CHARS],
        "passed": inv.passed,
        "duration_ms": inv.duration_ms,
        "shared_values": run.shared,
        "stored_bytes": run.stored_bytes,
        **run.fields,
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
        duration_ms=duration_ms,
        reason=reason,
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
    naming the first such case; else a failed case ends it `failed`.
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
    elif failed:
        first = failed[0]
        reason = (
            f"{len(failed)} of {len(cases)} case(s) failed; "
            f"{first.agent_name}::{first.test_name}: {first.failure_reason}"
        )
        _end(gate, GateStatus.failed, phase=Phase.done, reason=reason)
    else:
        _end(gate, GateStatus.passed, phase=Phase.done, reason=None)

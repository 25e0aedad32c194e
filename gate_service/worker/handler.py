"""Judging one gate: validating → building → running_tests → done.

Each stage writes in its own short transaction after checking the lease, and every judged
case is stored as soon as it lands, so a retry after a crash resumes where the last worker
stopped instead of starting over.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ..bundles.archive import read_archive
from ..bundles.suites import validate_project
from ..config import Settings
from ..db import session_scope
from ..errors import GateError, SandboxError
from ..gates import service
from ..models import Bundle, Case, CaseStatus, Gate, Phase
from ..runner_contract import RunnerOutputError, parse_runner_output
from ..sandbox import RunLimits, Sandbox, TestImageSpec
from ..sandbox.docker_engine import WheelDownloadError
from . import queue
from .queue import ClaimedJob

log = logging.getLogger(__name__)
T = TypeVar("T")

# Seconds the runner may spend per invocation beyond timeout_s (fork, load, verdict).
PER_INVOCATION_SLACK_SECONDS = 5
_REQUIREMENT_OPTION = re.compile(r"^\s*-")


class BundleRejected(Exception):
    """The bundle cannot be judged as it is; retrying would not help."""

    def __init__(self, reason: str, problems: list[dict[str, Any]] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.problems = problems or []


class Stopping(Exception):
    """The worker is shutting down; hand the job back to the queue."""


@dataclass
class WorkerContext:
    settings: Settings
    sessions: sessionmaker[Session]
    sandbox: Sandbox
    stop: threading.Event


def _write(ctx: WorkerContext, job: ClaimedJob, fn: Callable[[Session, Gate], T]) -> T:
    """Run ``fn`` in its own transaction, after proving we still hold the job's lease."""
    with session_scope(ctx.sessions) as session:
        queue.fence(session, job)
        gate = service.get_gate(session, job.gate_id, for_update=True)
        return fn(session, gate)


def case_environment(settings: Settings, model_mode: str | None) -> dict[str, str]:
    """What a case container sees: the variables named in GATE_CASE_ENV, and the model mode.

    Only named variables pass, so the service's own settings and secrets never do.
    """
    env = {
        name: os.environ[name]
        for name in (n.strip() for n in settings.case_env.split(","))
        if name and name in os.environ and not name.startswith("GATE_")
    }
    if model_mode:
        env["GATE_MODEL_MODE"] = model_mode
    return env


def test_image_tag(sha256: str, runner_tag: str) -> str:
    runner_digest = runner_tag.rsplit(":", 1)[-1]
    return f"gate-test:{sha256[:16]}-{runner_digest}"


def requirement_lines(path: Path) -> list[str]:
    """The requirement specifiers of a bundle's requirements.txt; pip options are refused.

    An option line could point pip at another index, and a URL or path at anything on the
    host, so only plain specifiers (name, extras, version, markers) are accepted.
    """
    if not path.is_file():
        return []
    lines = []
    for number, raw in enumerate(
        path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
    ):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if (
            _REQUIREMENT_OPTION.match(line)
            or "/" in line
            or "\\" in line
            or "$" in line  # pip expands ${VAR} from the host's environment
            or " @ " in line
            or line.startswith(".")
        ):
            raise BundleRejected(
                f"requirements.txt line {number} ({line!r}) is not a plain requirement; "
                "options, URLs and paths are not allowed",
                [
                    {
                        "file": "requirements.txt",
                        "line": number,
                        "message": "not a plain requirement",
                    }
                ],
            )
        lines.append(line)
    return lines


def judge_gate(ctx: WorkerContext, job: ClaimedJob) -> None:
    """Take a claimed job to a verdict, or give it back to the queue for another attempt."""
    try:
        _judge(ctx, job)
    except queue.LeaseLost:
        log.warning("lost the lease on job %s; another worker has it now", job.id)
    except BundleRejected as exc:
        rejected = exc

        def reject(session: Session, gate: Gate) -> None:
            service.fail_gate(gate, reason=rejected.reason, problems=rejected.problems)
            queue.finish(session, job, error=rejected.reason)

        _write(ctx, job, reject)
    except Stopping:
        with session_scope(ctx.sessions) as session:
            queue.release(session, job, error="the worker shut down during the job", refund=True)
    except Exception as exc:
        detail = exc.detail if isinstance(exc, GateError) else f"{type(exc).__name__}: {exc}"
        log.exception("job %s attempt %s failed", job.id, job.attempts)
        if job.attempts < ctx.settings.job_max_attempts:
            with session_scope(ctx.sessions) as session:
                queue.release(session, job, error=detail)
            return

        def give_up(session: Session, gate: Gate) -> None:
            service.fail_gate(
                gate,
                reason=f"infrastructure error after {job.attempts} attempt(s): {detail}",
            )
            queue.finish(session, job, error=detail)

        _write(ctx, job, give_up)


def _judge(ctx: WorkerContext, job: ClaimedJob) -> None:
    def begin(session: Session, gate: Gate) -> tuple[bool, str, str | None, bytes]:
        if gate.cancel_requested:
            service.cancel_gate(gate)
            queue.finish(session, job)
            return False, "", None, b""
        service.start_gate(gate)
        data = session.scalar(select(Bundle.data).where(Bundle.sha256 == gate.bundle_sha256))
        return True, gate.bundle_sha256, gate.filter, data or b""

    go_on, sha256, name_filter, data = _write(ctx, job, begin)
    if not go_on:
        return
    with tempfile.TemporaryDirectory(prefix="gate-", dir=ctx.settings.runtime_dir()) as tmp:
        context_dir = Path(tmp)
        bundle_dir = context_dir / "bundle"
        bundle_dir.mkdir()
        try:
            read_archive(data, bundle_dir)
        except GateError as exc:
            raise BundleRejected(f"the bundle cannot be read: {exc.detail}", exc.problems) from None
        report = validate_project(bundle_dir, name_filter)
        if report.problems:
            first = report.problems[0]
            where = f"{first['file']}" + (f" case {first['case']!r}" if first.get("case") else "")
            raise BundleRejected(
                f"{len(report.problems)} problem(s) in the bundle's suites; first: "
                f"{where}: {first['message']}",
                report.problems,
            )

        def enter_building(session: Session, gate: Gate) -> None:
            service.save_cases(session, gate, report.cases)
            service.set_phase(gate, Phase.building)

        _write(ctx, job, enter_building)
        image = _build_image(ctx, context_dir, sha256)

    _write(ctx, job, lambda _s, gate: service.set_phase(gate, Phase.running_tests))
    _run_cases(ctx, job, image)

    def conclude(session: Session, gate: Gate) -> None:
        if gate.cancel_requested:
            service.cancel_gate(gate)
        else:
            service.finish_gate(session, gate)
        queue.finish(session, job)

    _write(ctx, job, conclude)


def _build_image(ctx: WorkerContext, context_dir: Path, sha256: str) -> str:
    sandbox = ctx.sandbox
    tag = test_image_tag(sha256, sandbox.runner_image())
    if sandbox.image_exists(tag):
        return tag
    requirements = requirement_lines(context_dir / "bundle" / "requirements.txt")
    if requirements:
        clean = context_dir / "requirements.clean.txt"
        clean.write_text("\n".join(requirements) + "\n")
        try:
            sandbox.download_wheels(clean, context_dir / "wheels")
        except WheelDownloadError as exc:
            raise BundleRejected(
                f"requirements.txt cannot be installed from the configured wheelhouse or index: "
                f"{exc}"
            ) from None
    return sandbox.build_test_image(
        TestImageSpec(
            tag=tag,
            context_dir=context_dir,
            with_wheels=bool(requirements),
            labels={"gate.bundle": sha256},
        )
    )


def _run_cases(ctx: WorkerContext, job: ClaimedJob, image: str) -> None:
    with session_scope(ctx.sessions) as session:
        pending = [
            (c.id, c.suite, c.test_name, c.runs, c.timeout_s)
            for c in session.scalars(
                select(Case)
                .where(Case.gate_id == job.gate_id)
                .where(Case.status.in_([CaseStatus.queued, CaseStatus.running]))
                .order_by(Case.position)
            )
        ]
    with ThreadPoolExecutor(max_workers=ctx.settings.case_concurrency) as pool:
        futures = [pool.submit(_run_case, ctx, job, image, *p) for p in pending]
        judged = [future.result() for future in futures]
    if not all(judged) and ctx.stop.is_set():
        raise Stopping()


def _run_case(
    ctx: WorkerContext,
    job: ClaimedJob,
    image: str,
    case_id: uuid.UUID,
    suite: str,
    test_name: str,
    runs: int,
    timeout_s: int,
) -> bool:
    """Judge one case in its container; False when it was skipped (stop, cancel, halt)."""
    if ctx.stop.is_set() or job.halt.is_set():
        return False

    def mark_running(session: Session, gate: Gate) -> tuple[bool, str | None]:
        if gate.cancel_requested:
            return False, None
        case = session.get_one(Case, case_id)
        case.status = CaseStatus.running
        gate.revision += 1
        return True, gate.model_mode

    go_on, model_mode = _write(ctx, job, mark_running)
    if not go_on:
        return False
    s = ctx.settings
    # Each invocation: the agent's timeout_s, then a builder cleanup's own budget (the runner
    # gives it timeout_s, at most 120 s), then forking and judging.
    per_invocation = timeout_s + min(timeout_s, 120) + PER_INVOCATION_SLACK_SECONDS
    wall = runs * per_invocation + s.case_deadline_slack_seconds
    limits = RunLimits(
        memory_mb=s.case_memory_mb,
        cpus=s.case_cpus,
        pids=s.case_pids_limit,
        wall_seconds=wall,
        tmpfs_mb=s.case_tmpfs_mb,
        output_limit_bytes=s.case_output_limit_bytes,
        network=s.case_network,
    )
    try:
        result = ctx.sandbox.run(
            image,
            ["run-case", "--project", "/bundle", "--suite", suite, "--case", test_name],
            env=case_environment(s, model_mode),
            limits=limits,
            labels={
                "gate.gate_id": str(job.gate_id),
                "gate.case_id": str(case_id),
                "gate.owner": job.owner,
            },
        )
    except SandboxError:
        if job.halt.is_set():  # the heartbeat removed the container (cancel or lost lease)
            return False
        raise

    def store(session: Session, gate: Gate) -> None:
        case = session.get_one(Case, case_id)
        if result.timed_out:
            service.save_case_outcome(
                gate,
                case,
                status=CaseStatus.failed,
                duration_ms=result.duration_ms,
                reason=f"the case container ran past its hard deadline of {wall} s and was killed",
            )
        elif result.oom_killed:
            service.save_case_outcome(
                gate,
                case,
                status=CaseStatus.failed,
                duration_ms=result.duration_ms,
                reason=f"the case container ran out of memory (limit {s.case_memory_mb} MB)",
            )
        else:
            try:
                parsed = parse_runner_output(result.stdout)
            except RunnerOutputError as exc:
                tail = result.stderr.decode("utf-8", "replace").replace("\x00", "")[-1500:].strip()
                service.save_case_outcome(
                    gate,
                    case,
                    status=CaseStatus.error,
                    duration_ms=result.duration_ms,
                    reason=f"the runner failed (exit code {result.exit_code}): {exc}"
                    + (f"; stderr: {tail}" if tail else ""),
                )
            else:
                service.save_case_result(session, gate, case, parsed)

    _write(ctx, job, store)
    return True

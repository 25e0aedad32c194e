"""Judging one gate: validating → building → running_tests → done.

Each stage writes in its own short transaction after checking the lease, and every judged
case is stored as soon as it lands, so a retry after a crash resumes where the last worker
stopped instead of starting over.
"""

from __future__ import annotations

import contextvars
import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache, partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gate_runner import case_env as handoff
from gate_runner.contract import MAX_CLEANUP_SECONDS
from gate_runner.sequential import wilson_applies
from gate_runner.verdict import STOP_DECIDED, STOP_FAILING

from .. import incidents
from ..api_specs import loader_tools
from ..baselines import judging
from ..baselines.closure import closure_hashes, environment_digest, why_not_reusable
from ..bundles.archive import read_archive
from ..bundles.live_models import (
    GUARDRAIL_FIELD,
    LiveModel,
    agent_modes,
    live_models,
    mode_reason,
    triggers_agents,
    unjudged_warnings,
)
from ..bundles.requirements import FILE as REQUIREMENTS_FILE
from ..bundles.requirements import read_requirements
from ..bundles.suites import ProjectReport, validate_project
from ..bundles.support import MAX_WARNINGS
from ..bundles.wheels import DownloadHalted, WheelDownloadError, fetch_wheels
from ..config import Settings
from ..db import refused_write, session_scope
from ..errors import GateError
from ..gates import lifecycle
from ..gateway import (
    CallRecord,
    Channel,
    ModelGateway,
    ModelRoute,
    provider_secret_names,
    unrouted,
)
from ..jobs import ClaimedJob, LeaseLost
from ..logs import bind_log_context
from ..metrics import Metrics
from ..models import CaseStatus, Gate, Phase, utcnow
from ..projects.service import settings_of
from ..runner_contract import UntrustedResult
from ..sandbox import (
    INVOCATION_UID,
    SCRATCH_DIR,
    BuildRefused,
    CaseContainer,
    Halted,
    ModelChannel,
    RunLimits,
    RunResult,
    Sandbox,
    SandboxError,
    TestImageSpec,
    case_network,
)
from ..scratch import scratch_dir
from ..secrets.crypto import SecretBox
from ..secrets.redact import Redactor, redact_result
from ..secrets.service import project_secrets, secret_fingerprints
from .outcome import CaseFacts, Judged, NotJudged, Outcome, case_outcome, untrusted
from .slots import CaseLease, CaseSlots

if TYPE_CHECKING:
    from .wakeup import JobWakeup

log = logging.getLogger(__name__)
T = TypeVar("T")

# Seconds the runner may spend per invocation beyond timeout_s (fork, load, verdict).
PER_INVOCATION_SLACK_SECONDS = 5


class BundleRejected(Exception):
    """The bundle cannot be judged as it is; retrying would not help."""

    def __init__(self, reason: str, problems: list[dict[str, Any]] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.problems = problems or []


class Stopping(Exception):
    """The worker is shutting down; hand the job back to the queue."""


class StorageRefused(Exception):
    """Postgres refused what a write stores: the same write would be refused again, so it is
    not retried as if the infrastructure had failed."""

    def __init__(self, why: str, reference: str) -> None:
        super().__init__(why)
        self.reason = f"{why} (reference {reference}; the full detail is in the worker log)"


class DeadlinePassed(BundleRejected):
    """The gate used up GATE_GATE_DEADLINE_SECONDS (from its start, retries included)."""

    def __init__(self, seconds: int) -> None:
        super().__init__(
            f"the gate ran past its deadline of {seconds} s (GATE_GATE_DEADLINE_SECONDS)"
        )


def time_left(settings: Settings, started_at: datetime | None) -> float:
    """Seconds until the gate's deadline; DeadlinePassed when less than one is left."""
    if started_at is None:  # not started: the whole budget
        return float(settings.gate_deadline_seconds)
    end = started_at + timedelta(seconds=settings.gate_deadline_seconds)
    left = (end - utcnow()).total_seconds()
    if left < 1:
        raise DeadlinePassed(settings.gate_deadline_seconds)
    return left


@dataclass
class WorkerContext:
    settings: Settings
    sessions: sessionmaker[Session]
    sandbox: Sandbox
    stop: threading.Event
    # Decrypts the project secrets cases receive; None builds it from the settings when the
    # worker starts (GATE_SECRETS_KEY, else GATE_DATA_DIR/secrets.key), never at import.
    secret_box: SecretBox | None = None
    # This process's instruments; `gate serve` passes the API's, so /metrics shows them.
    metrics: Metrics = field(default_factory=Metrics)
    # The process's LISTEN for queued jobs, shared by its workers; None: they only poll.
    jobs: JobWakeup | None = None
    # The process's model gateway, shared by its workers (GATE_MODEL_GATEWAY): each case gets
    # a channel of its own, and the project's provider keys stay here. None: no channel, and
    # a live case fails saying so (the runner image carries no provider library).
    gateway: ModelGateway | None = None

    def __post_init__(self) -> None:
        if self.secret_box is None:
            self.secret_box = SecretBox.from_settings(self.settings)

    def box(self) -> SecretBox:
        assert self.secret_box is not None  # set in __post_init__
        return self.secret_box


def _write(ctx: WorkerContext, job: ClaimedJob, fn: Callable[[Session, Gate], T]) -> T:
    """Run ``fn`` in its own transaction, after proving we still hold the job's lease, with
    the gate loaded and its row locked.

    StorageRefused when Postgres refuses the data itself (see ``db.refused_write``).
    """

    def with_gate(session: Session) -> T:
        return fn(session, lifecycle.get_gate(session, job.gate_id, for_update=True))

    return _write_case(ctx, job, with_gate)


def _write_case(ctx: WorkerContext, job: ClaimedJob, fn: Callable[[Session], T]) -> T:
    """``_write`` for a case's store, which locks the gate's row itself (Core statements,
    no gate loaded: it is on every case's path)."""
    try:
        with job.transaction(ctx.sessions) as session:
            return fn(session)
    except (DBAPIError, UnicodeEncodeError) as exc:
        why = refused_write(exc)
        if why is None:
            raise
        reference = incidents.new_reference()
        log.error(
            "job %s: Postgres refused a write (reference %s)", job.id, reference, exc_info=exc
        )
        raise StorageRefused(incidents.scrub(why), reference) from exc


def case_environment(settings: Settings) -> dict[str, str]:
    """The operator's part of a case's environment: the variables named in GATE_CASE_ENV.

    Only named variables pass, so the service's own settings and secrets never do (and the
    names are checked at start-up, see Settings). They reach invocation processes only.
    """
    return {name: os.environ[name] for name in settings.case_env_names() if name in os.environ}


def runner_argv(
    settings: Settings,
    suite: str,
    test_name: str,
    model_mode: str | None = None,
    guardrail_model: str | None = None,
    stop_early: str | None = None,
    wilson_max_runs: int | None = None,
) -> list[str]:
    """The runner's command line for one case (runner contract v2).

    `--case=NAME`: a case name is the bundle's text, and one that starts with '-' must stay
    the option's value. `--handoff`: the case's environment and nonce arrive on stdin.
    `--guardrail-model=NAME`: the project's judge model, when it names one (a model name as
    the API took it: letters, digits and ``._-/:@+``). `--stop-early=MODE`: the early stop
    the gate allows (``early_stop_mode``), when it allows one.
    """
    argv = [
        "run-case",
        "--project", "/bundle",
        f"--suite={suite}",
        f"--case={test_name}",
        "--invocation-uid", str(INVOCATION_UID),
        "--output-limit-bytes", str(settings.case_invocation_output_limit_bytes),
        "--scratch-dir", SCRATCH_DIR,
        "--handoff",
    ]  # fmt: skip
    if model_mode:
        argv.append(f"--model-mode={model_mode}")
    if guardrail_model:
        argv.append(f"--guardrail-model={guardrail_model}")
    if stop_early:
        argv.append(f"--stop-early={stop_early}")
    if wilson_max_runs:
        argv.append(f"--wilson-max-runs={wilson_max_runs}")
    return argv


def early_stop_mode(
    settings: Settings, baseline: str | None, verdict_rule: str, labelled: bool = False
) -> str | None:
    """The runner's --stop-early for a gate's cases (docs/baselines.md, "Early stop"): none
    with GATE_EARLY_STOP off, or under the Wilson rule (which decides when to stop itself);
    "decided" (a case stops once its verdict is known either way) only when nothing needs a
    passing case's full rate: the gate names no baseline (its regression test compares
    rates) and carries no labels (a labelled gate may be a later gate's baseline, named by
    its label); else "failing" (only once it can no longer pass)."""
    if not settings.early_stop or verdict_rule == "wilson":
        return None
    if baseline is None and not labelled:
        return STOP_DECIDED
    return STOP_FAILING


def invocation_seconds(timeout_s: int) -> int:
    """The longest one invocation of a case may take: the agent's timeout_s, then a builder
    cleanup's own budget (the runner gives it timeout_s, at most 120 s), then forking and
    judging."""
    return timeout_s + min(timeout_s, MAX_CLEANUP_SECONDS) + PER_INVOCATION_SLACK_SECONDS


def wilson_cap(
    settings: Settings, configured: int | None, runs: int, success_threshold: int, timeout_s: int
) -> int | None:
    """The Wilson rule's cap of invocations for one case (the runner's --wilson-max-runs, and
    what the worker checks its stopping point against): GATE_WILSON_MAX_RUNS, but no more
    than fit in the gate's deadline one after another, and never fewer than its runs; None
    when the rule does not judge the case (the project's rule is the threshold, or the case
    has one run or a threshold of 0 or 100%)."""
    if not configured or not wilson_applies(runs, success_threshold):
        return None
    per_invocation = invocation_seconds(timeout_s)
    fit = (settings.gate_deadline_seconds - settings.case_deadline_slack_seconds) // per_invocation
    return max(runs, min(configured, fit))


def test_image_tag(sha256: str, runner_tag: str) -> str:
    """The full bundle sha256: a prefix could let one bundle's image stand in for another's."""
    runner_digest = runner_tag.rsplit(":", 1)[-1]
    return f"gate-test:{sha256}-{runner_digest}"


def judge_gate(
    ctx: WorkerContext,
    job: ClaimedJob,
    slots: CaseSlots | None = None,
    containers: CaseSlots | None = None,
) -> None:
    """Take a claimed job to a verdict, or give it back to the queue for another attempt.

    ``slots``: the worker's case slots (CPU: GATE_CASE_CONCURRENCY) and ``containers`` its
    container slots (memory: Settings.case_container_limit), shared with the other gates it
    holds; without them the gate has its own.
    """
    try:
        _judge_gate(ctx, job, WorkerSlots.of(ctx, slots, containers))
    except LeaseLost:  # a write that ends the attempt (a rejection, a release) found it lost
        _lease_lost(ctx, job)
    finally:
        if ctx.gateway is not None:  # the gate's model budget ends with this attempt
            ctx.gateway.end_gate(str(job.gate_id))


def _judge_gate(ctx: WorkerContext, job: ClaimedJob, slots: WorkerSlots) -> None:
    try:
        _judge(ctx, job, slots)
    except LeaseLost:
        _lease_lost(ctx, job)
    except BundleRejected as exc:
        rejected = exc

        def reject(session: Session, gate: Gate) -> None:
            if isinstance(rejected, DeadlinePassed):
                lifecycle.close_unjudged(session, gate, "not run: the gate ran past its deadline")
            lifecycle.fail_gate(gate, reason=rejected.reason, problems=rejected.problems)
            job.finish(session, error=rejected.reason)
            ctx.metrics.gate_finished(session, gate)

        _write(ctx, job, reject)
    except Stopping:
        with session_scope(ctx.sessions) as session:
            job.release(session, error="the worker shut down during the job", refund=True)
    except StorageRefused as exc:
        refused = exc

        def refuse(session: Session, gate: Gate) -> None:
            reason = (
                f"the gate's data could not be stored: {refused.reason}; not retried, since "
                "the same data would be refused again"
            )
            lifecycle.close_unjudged(session, gate, f"not judged: {reason}")
            lifecycle.fail_gate(gate, reason=reason)
            job.finish(session, error=reason)
            ctx.metrics.gate_finished(session, gate)

        _write(ctx, job, refuse)
    except Exception as exc:
        if _gone(ctx, job):  # e.g. an unfenced read found its gate or bundle deleted
            _lease_lost(ctx, job)
            return
        # Users read the summary; the host's paths, SQL and socket stay in this log line.
        reference = incidents.new_reference()
        detail = incidents.public(exc, reference)
        log.exception("job %s attempt %s failed (reference %s)", job.id, job.attempts, reference)
        if job.attempts < ctx.settings.job_max_attempts:
            with session_scope(ctx.sessions) as session:
                job.release(session, error=detail)
            return

        def give_up(session: Session, gate: Gate) -> None:
            reason = f"infrastructure error after {job.attempts} attempt(s): {detail}"
            lifecycle.close_unjudged(session, gate, f"not judged: {reason}")
            lifecycle.fail_gate(gate, reason=reason)
            job.finish(session, error=detail)
            ctx.metrics.gate_finished(session, gate)

        _write(ctx, job, give_up)


def _gone(ctx: WorkerContext, job: ClaimedJob) -> bool:
    """Whether the job's gate was deleted with its project (False when that cannot be told)."""
    try:
        with session_scope(ctx.sessions) as session:
            return job.gone(session)
    except SQLAlchemyError:
        return False


def _lease_lost(ctx: WorkerContext, job: ClaimedJob) -> None:
    """The job is no longer ours: said once, as a warning. Nothing is written: its gate's
    rows are another worker's now, or gone with their project (projects/deletion.py), whose
    deletion stands in for a cancel (the heartbeat removes the job's containers)."""
    if _gone(ctx, job):
        log.warning("job %s: its gate was deleted with its project; stopped", job.id)
    else:
        log.warning("lost the lease on job %s; another worker has it now", job.id)


@contextmanager
def _fetched_bundle(ctx: WorkerContext, sha256: str, path: Path) -> Iterator[IO[bytes]]:
    """The stored bundle copied to ``path`` a chunk at a time, open for reading."""
    try:
        with open(path, "w+b") as file:
            with ctx.sessions() as session:
                for chunk in lifecycle.read_bundle(session, sha256):
                    file.write(chunk)
            file.seek(0)
            yield file
    finally:
        path.unlink(missing_ok=True)  # not part of the image build: only bundle/ is


def _judge(ctx: WorkerContext, job: ClaimedJob, slots: WorkerSlots) -> None:
    def begin(
        session: Session, gate: Gate
    ) -> tuple[
        bool, str, str | None, dict[str, Any], str | None, tuple[str, str | None], tuple[str, str]
    ]:
        if gate.cancel_requested:
            lifecycle.cancel_gate(gate)
            job.finish(session)
            ctx.metrics.gate_ended_unstarted(session, gate)
            return False, "", None, {}, None, ("", None), ("", "")
        first_start = gate.started_at is None  # a retry has left the queue already
        lifecycle.start_gate(
            gate, {"backend": ctx.settings.sandbox_backend, "runtime": ctx.sandbox.runtime}
        )
        if first_start:
            ctx.metrics.gate_started(session, gate)
        time_left(ctx.settings, gate.started_at)  # a retry may start past the deadline
        project = settings_of(session, gate.project_id)
        api_tools = loader_tools(project.api_specs)
        # The judge model, read once an attempt: checked below and handed to every case.
        judge = (project.name, project.guardrail_model)
        # What reaches the cases from outside the bundle, for their closure hashes: the
        # secrets' fingerprints (nothing decrypted), GATE_CASE_ENV, the verdict rule.
        outside = (
            environment_digest(
                secret_fingerprints(session, gate.project_id), case_environment(ctx.settings)
            ),
            project.verdict_rule,
        )
        return True, gate.bundle_sha256, gate.filter, api_tools, gate.model_mode, judge, outside

    go_on, sha256, name_filter, api_tools, model_mode, judge, outside = _write(ctx, job, begin)
    project_name, guardrail_model = judge
    if not go_on:
        return
    # A scratch directory this process holds locked, so a crash leaves nothing for good.
    with scratch_dir(ctx.settings, "build-") as context_dir:
        bundle_dir = context_dir / "bundle"
        bundle_dir.mkdir()
        try:
            with _fetched_bundle(ctx, sha256, context_dir / "bundle.archive") as archive:
                read_archive(archive, bundle_dir)
        except GateError as exc:
            raise BundleRejected(f"the bundle cannot be read: {exc.detail}", exc.problems) from None
        # requirements.txt is data: parsed here, before anything is fetched, and only what
        # parsed as a plain PEP 508 requirement ever reaches pip (as arguments, never a file).
        requirements = read_requirements(bundle_dir / REQUIREMENTS_FILE)
        report = validate_project(bundle_dir, name_filter, api_tools)
        if requirements.problems:
            first = requirements.problems[0]
            problems = requirements.problems + report.problems
            raise BundleRejected(
                f"{len(problems)} problem(s) in the bundle; first: "
                f"{REQUIREMENTS_FILE} line {first['line']}: {first['message']}",
                problems,
            )
        if report.problems:
            first = report.problems[0]
            where = f"{first['file']}" + (f" case {first['case']!r}" if first.get("case") else "")
            raise BundleRejected(
                f"{len(report.problems)} problem(s) in the bundle's suites; first: "
                f"{where}: {first['message']}",
                report.problems,
            )
        cap = ctx.settings.max_cases_per_gate
        if len(report.cases) > cap:
            message = (
                f"the bundle selects {len(report.cases)} cases; the limit is {cap} per gate "
                "(GATE_MAX_CASES_PER_GATE): split it, or submit with a filter"
            )
            count = {"message": message, "cases": len(report.cases), "limit": cap}
            raise BundleRejected(message, [count])
        # Before anything is built: every model a selected case would call live has a key or
        # a route (the gateway's per-call lookup stays the backstop).
        # The bundle is read once for trigger_agent; the three questions below share it.
        triggers = triggers_agents(bundle_dir)
        _check_live_models(
            ctx, job, bundle_dir, report, model_mode, guardrail_model, triggers=triggers
        )
        # First among the warnings: judged guardrails the gate will skip, never blocking.
        report.warnings = [
            *unjudged_warnings(
                bundle_dir,
                report.configs,
                report.cases,
                model_mode,
                guardrail_model,
                project_name,
                triggers=triggers,
            ),
            *report.warnings,
        ][:MAX_WARNINGS]

        case_agents = {case.agent_name for case in report.cases}
        modes = agent_modes(bundle_dir, report.configs, case_agents, model_mode, triggers)

        # Each case's closure hash: what its history is compared and reused by.
        environment, verdict_rule = outside
        closures = closure_hashes(
            bundle_dir,
            report.cases,
            modes,
            guardrail_model=guardrail_model,
            verdict_rule=verdict_rule,
            environment=environment,
        )

        # By agent: why its cases may not be reused by an incremental gate (None: they may),
        # asked only of an incremental gate's candidates (file lookups, no reads).
        @cache
        def why_not(agent: str) -> str | None:
            return why_not_reusable(
                bundle_dir, report.configs, agent, model_mode, guardrail_model, triggers
            )

        def enter_building(session: Session, gate: Gate) -> None:
            lifecycle.save_cases(session, gate, report.cases, closures)
            # Decided once: a retried job keeps the baseline its cases were reused from.
            no_baseline = None
            if gate.baseline_gate_id is None:
                gate.baseline_gate_id, no_baseline = judging.resolve_baseline(session, gate)
            if no_baseline is not None:  # a branch's first gate, say: nothing is compared
                report.warnings.insert(0, judging.no_baseline_warning(gate, no_baseline))
            reuses, not_reused, already = judging.reusable_cases(session, gate, why_not)
            for reuse in reuses:
                lifecycle.reuse_case(reuse.case, reuse.base, reuse.why)
            if gate.changed_only and gate.baseline_gate_id is not None:
                reused = len(reuses) + already
                note = judging.reuse_note(gate, reused, len(report.cases), not_reused)
                report.warnings.insert(0, note)
            lifecycle.record_warnings(gate, report.warnings[:MAX_WARNINGS])
            lifecycle.record_model_modes(gate, modes, mode_reason(modes, model_mode))
            lifecycle.set_phase(gate, Phase.building)

        _write(ctx, job, enter_building)
        image = _build_image(ctx, context_dir, sha256, requirements.requirements, job.halt)

    if image is not None:  # None: halted (cancelled, or the lease lost) while it was built
        _write(ctx, job, lambda _s, gate: lifecycle.set_phase(gate, Phase.running_tests))
        _run_cases(ctx, job, image, slots, guardrail_model)

    def conclude(session: Session, gate: Gate) -> None:
        if gate.cancel_requested:
            lifecycle.cancel_gate(gate)
        else:
            # Quarantines, the baseline and the case's history, stored on each case first:
            # the verdict reads them.
            more = judging.annotate_cases(session, gate, ctx.settings)
            if more:
                lifecycle.record_warnings(gate, [*more, *gate.warnings][:MAX_WARNINGS])
            lifecycle.finish_gate(session, gate)
        job.finish(session)
        ctx.metrics.gate_finished(session, gate)

    _write(ctx, job, conclude)


# At most this many unanswerable models are spelled out in a gate's failure_reason (its
# problems list every one).
MAX_MODELS_IN_REASON = 5


def _check_live_models(
    ctx: WorkerContext,
    job: ClaimedJob,
    bundle_dir: Path,
    report: ProjectReport,
    model_mode: str | None,
    guardrail_model: str | None = None,
    *,
    triggers: bool | None = None,
) -> None:
    """BundleRejected naming each agent, model and fix when a model that a selected case
    would call live (an LLM agent's own, or the project's ``guardrail_model`` judging an
    agent's judged guardrails) has neither a provider key among the project's secrets nor a
    project route; or, with the model gateway off on this server, when any would be called
    live at all (a case's container has no other way to a provider)."""
    gateway = ctx.gateway
    case_agents = {case.agent_name for case in report.cases}
    needed = live_models(
        bundle_dir, report.configs, case_agents, model_mode, guardrail_model, triggers
    )
    if not needed:
        return  # no live agent: the project's secrets are not even read
    if gateway is None:
        raise _gateway_off(needed, model_mode)
    # LiteLLM is imported here, in validating, for a gate that calls a model live: never
    # inside a case's deadline, and never for a scripted or replay gate (issue 43).
    gateway.load()
    with session_scope(ctx.sessions) as session:
        project_id = session.get_one(Gate, job.gate_id).project_id
        secrets = project_secrets(session, ctx.box(), project_id)
        project = settings_of(session, project_id)
        routes = project.routes
        name = project.name
    problems: list[dict[str, Any]] = []
    for live in needed:
        missing = unrouted(live.model, secrets, routes, provider_of=gateway.provider_of)
        if missing is not None:
            message = f"{missing.reason}; {_fixes(name, live, missing.secret, model_mode)}"
            what = f"{live.field} {live.model}"
            if live.guardrails:
                what += f", judging its {', '.join(live.guardrails)} guardrail"
                what += "s" if len(live.guardrails) > 1 else ""
            problems.append(_model_problem(live, f"({what}): {message}", missing.secret))
    if problems:
        raise _unanswered(
            f"{len(problems)} model(s) the cases would call live cannot be answered", problems
        )


def _gateway_off(needed: list[LiveModel], model_mode: str | None) -> BundleRejected:
    """No live call can be answered on a server whose model gateway is off: each model that
    would be called, and what would do instead."""
    problems = [
        _model_problem(
            live,
            f"({live.field} {live.model}) would call its model live; to fix: "
            + _offline_fix(live, model_mode),
        )
        for live in needed
    ]
    return _unanswered(
        "this server's model gateway is off (GATE_MODEL_GATEWAY=false), so no model can be "
        "called live",
        problems,
    )


def _model_problem(live: LiveModel, said: str, secret: str | None = None) -> dict[str, Any]:
    """One unanswerable model as a problem of the gate (its agent, field, model, secret)."""
    return {
        "file": live.source or "agents/",
        "case": None,
        "agent": live.agent,
        "field": live.field,
        "model": live.model,
        "secret": secret,
        "message": f"agent {live.agent!r} {said}",
    }


def _unanswered(why: str, problems: list[dict[str, Any]]) -> BundleRejected:
    """The gate's refusal in validating: ``why``, and the first problems spelled out."""
    shown = "; ".join(p["message"] for p in problems[:MAX_MODELS_IN_REASON])
    more = len(problems) - MAX_MODELS_IN_REASON
    return BundleRejected(
        f"{why}, so no case ran: {shown}"
        + (f"; and {more} more (see problems)" if more > 0 else ""),
        problems,
    )


def _offline_fix(live: LiveModel, model_mode: str | None) -> str:
    """How the agent's cases would need no live call: a scripted model or recordings."""
    offline = (
        f"give agent {live.agent!r} a scripted model tests/models/{live.agent}.py or "
        f"recordings tests/recordings/{live.agent}/"
    )
    return f"submit without model_mode=live and {offline}" if model_mode == "live" else offline


def _fixes(project: str, live: LiveModel, secret: str | None, model_mode: str | None) -> str:
    """What would answer the model: its secret, a project route, another judge model for the
    project's guardrail model, or no live call at all."""
    fixes = []
    if secret is not None:
        fixes.append(
            f"set the project secret {secret} (PUT /v1/projects/{project}/secrets/{secret})"
        )
    fixes.append(
        f"route the model to an endpoint (gate admin routes-set {project} "
        f"--route '{live.model}=URL#KEY_SECRET', which replaces its routes)"
    )
    if live.field == GUARDRAIL_FIELD:
        fixes.append(
            f"name a judge model the project can call (gate admin guardrail-model-set "
            f"{project} MODEL, or PUT /v1/projects/{project}/guardrail-model)"
        )
    elif live.guardrails:  # the rule's own judge model
        fixes.append(f"name another model in the rule's config.model ({live.source or 'agents/'})")
    if not live.guardrails:
        fixes.append(_offline_fix(live, model_mode))
    return "to fix: " + ", or ".join(fixes)


def _build_image(
    ctx: WorkerContext,
    context_dir: Path,
    sha256: str,
    requirements: list[str],
    halt: threading.Event,
) -> str | None:
    """The bundle's test image; None when ``halt`` stopped its download or build."""
    sandbox = ctx.sandbox
    tag = test_image_tag(sha256, sandbox.runner_image())
    hit = sandbox.image_exists(tag)
    ctx.metrics.image_lookup(hit=hit)
    if hit:
        return tag
    if requirements:
        try:
            fetch_wheels(ctx.settings, requirements, context_dir / "wheels", halt)
        except DownloadHalted:
            return None
        except WheelDownloadError as exc:
            raise BundleRejected(
                f"{REQUIREMENTS_FILE} cannot be installed from the configured wheelhouse or "
                f"index: {exc}",
                [{"file": REQUIREMENTS_FILE, "message": str(exc)}],
            ) from None
    try:
        return sandbox.build_test_image(
            TestImageSpec(
                tag=tag,
                context_dir=context_dir,
                requirements=tuple(requirements),
                labels={"gate.bundle": sha256},
            ),
            halt=halt,
        )
    except Halted:
        return None
    except BuildRefused as exc:
        raise BundleRejected(f"the test image cannot be built: {exc}") from None


@dataclass(frozen=True)
class WorkerSlots:
    """A worker's case slots: ``cpu`` for cases that compute, ``containers`` for all it keeps
    at once (a case waiting on its model lends its CPU slot, not its container slot)."""

    cpu: CaseSlots
    containers: CaseSlots

    @classmethod
    def of(
        cls, ctx: WorkerContext, cpu: CaseSlots | None, containers: CaseSlots | None
    ) -> WorkerSlots:
        return cls(
            cpu or CaseSlots(ctx.settings.case_concurrency),
            containers or CaseSlots(ctx.settings.case_container_limit(ctx.sandbox.runtime)),
        )


def _run_cases(
    ctx: WorkerContext,
    job: ClaimedJob,
    image: str,
    slots: WorkerSlots,
    guardrail_model: str | None = None,
) -> None:
    with session_scope(ctx.sessions) as session:
        gate = session.get_one(Gate, job.gate_id)
        # Fixed at submission, so read once: each case's container is made with it.
        model_mode = gate.model_mode
        # The early stop too (the gate's baseline and labels, the project's verdict rule).
        inputs = _case_inputs(ctx, session, gate.project_id, gate.baseline, bool(gate.labels))
        pending = lifecycle.unjudged_cases(session, job.gate_id)
    with ThreadPoolExecutor(max_workers=slots.containers.size) as pool:
        # Each case in its own copy of this thread's log context (gate_id, worker).
        futures = [
            pool.submit(
                contextvars.copy_context().run,
                partial(
                    _run_case_in_slot,
                    slots,
                    ctx,
                    job,
                    image,
                    model_mode,
                    guardrail_model,
                    inputs,
                    *p,
                ),
            )
            for p in pending
        ]
        judged = [future.result() for future in futures]
    if not all(judged) and ctx.stop.is_set():
        raise Stopping()


def _run_case_in_slot(
    slots: WorkerSlots,
    ctx: WorkerContext,
    job: ClaimedJob,
    image: str,
    model_mode: str | None,
    guardrail_model: str | None,
    inputs: _CaseInputs,
    case_id: uuid.UUID,
    suite: str,
    test_name: str,
    *judging: int,
) -> bool:
    """``_run_case`` with the case's slots (see slots.py): a container slot for its
    container's life, and within it a case (CPU) slot, lent while it waits on its model.

    The container is made once the container slot is the case's and removed after the case
    slot is given back, so the engine's create and removal of one case overlap the runs of
    others: only the start, the run and the reading of its output hold a case slot.
    """
    if ctx.stop.is_set() or job.halt.is_set():
        return False
    bind_log_context(case_id=case_id, case=f"{suite}::{test_name}")
    with slots.containers.slot(job.id, job.project_id), ExitStack() as held:
        # Left in reverse: the case slot, then the container, then its channel's folder.
        folder = held.enter_context(ctx.gateway.case_folder()) if ctx.gateway else None
        try:
            container = ctx.sandbox.create(
                image,
                runner_argv(
                    ctx.settings,
                    suite,
                    test_name,
                    model_mode,
                    guardrail_model,
                    stop_early=inputs.stop_early,
                    wilson_max_runs=wilson_cap(ctx.settings, inputs.wilson_max_runs, *judging),
                ),
                # Its wall deadline is the start's (see _run_case), not the container's.
                limits=case_limits(ctx.settings, 0, ctx.sandbox.runtime),
                labels={
                    "gate.gate_id": str(job.gate_id),
                    "gate.case_id": str(case_id),
                    "gate.owner": job.owner,
                },
                halt=job.halt,
                model_channel=ModelChannel.in_folder(folder) if folder is not None else None,
            )
        except SandboxError:  # Halted among them
            if job.halt.is_set():  # the gate was cancelled or its lease lost meanwhile
                return False
            raise
        held.callback(container.remove)
        lease = held.enter_context(CaseLease(slots.cpu, job.id, job.project_id))
        store = _run_case(
            ctx, job, container, folder, lease, inputs, case_id, suite, test_name, *judging
        )
    # Stored with the slots given back: the container is gone and the outcome known (a
    # deadline that ends the gate has halted it already), so the next case can start while
    # this one's result is written.
    return store is not None and store()


@dataclass(frozen=True)
class _CaseInputs:
    """What each case of a gate gets of its project, read once as the gate's cases begin (in
    each attempt): every case of a gate sees one state of its project, and a secret, route,
    egress host or API spec changed while the gate runs applies from its next gate."""

    # The GATE_CASE_ENV values and the project's secrets, less the provider keys when a
    # model gateway serves the case: what the case's invocations get.
    env: dict[str, str]
    secrets: dict[str, str]  # all the project's secrets: the gateway's to call with
    project_id: uuid.UUID
    routes: tuple[ModelRoute, ...]  # the project's model routes
    egress: tuple[str, ...]  # the project's egress allowlist
    # The project's API specs (prefix -> {base_url, headers, tools}).
    api_specs: dict[str, Any]
    # The runner's --stop-early for the gate's cases (early_stop_mode), None: run them all.
    stop_early: str | None = None
    # The runner's --wilson-max-runs under the project's verdict_rule: wilson, else None.
    wilson_max_runs: int | None = None


def _case_inputs(
    ctx: WorkerContext,
    session: Session,
    project_id: uuid.UUID,
    baseline: str | None = None,
    labelled: bool = False,
) -> _CaseInputs:
    """The project's part of its cases' inputs (see _CaseInputs), its secrets decrypted;
    ``baseline`` and ``labelled``: the gate's, which with the project's verdict rule decide
    the early stop."""
    # Decrypted before any case is marked: a key that does not fit fails the attempt (an
    # infrastructure error of the gate) with its cases still queued.
    project_env = project_secrets(session, ctx.box(), project_id)
    # The project's secrets and the GATE_CASE_ENV values: handed to the runner on its stdin
    # and given only to invocation processes (gate_runner/case_env.py). With a model
    # gateway, the provider keys are the gateway's alone.
    project = settings_of(session, project_id)
    routes = project.routes
    case_secrets = project_env
    if ctx.gateway is not None:
        # A route's key secret is a provider key too.
        withheld = provider_secret_names() | {r.key_secret for r in routes if r.key_secret}
        case_secrets = {k: v for k, v in project_env.items() if k not in withheld}
    return _CaseInputs(
        env={**case_environment(ctx.settings), **case_secrets},
        secrets=project_env,
        project_id=project_id,
        routes=routes,
        egress=project.egress,
        api_specs=project.api_specs,
        stop_early=early_stop_mode(ctx.settings, baseline, project.verdict_rule, labelled),
        wilson_max_runs=ctx.settings.wilson_max_runs if project.verdict_rule == "wilson" else None,
    )


def _run_case(
    ctx: WorkerContext,
    job: ClaimedJob,
    container: CaseContainer,
    folder: Path | None,
    lease: CaseLease | None,
    inputs: _CaseInputs,
    case_id: uuid.UUID,
    suite: str,
    test_name: str,
    runs: int,
    success_threshold: int,
    timeout_s: int,
) -> Callable[[], bool] | None:
    """Run one case in its created container and judge it: mark it running, run it, read its
    outcome. None when it was skipped (stop, cancel, halt); else what stores the outcome
    (True), or raises DeadlinePassed once the gate's deadline stopped it. ``folder``: where
    its model channel's socket goes, which the sandbox delivers into the container (as a
    ModelChannel; None: no gateway)."""
    if ctx.stop.is_set() or job.halt.is_set():
        return None
    seconds_left = _mark_running(ctx, job, case_id)
    if seconds_left is None:
        return None
    s = ctx.settings
    # Under the Wilson rule a case may run up to its cap of invocations, one at a time.
    cap = wilson_cap(s, inputs.wilson_max_runs, runs, success_threshold, timeout_s)
    wall = (cap or runs) * invocation_seconds(timeout_s) + s.case_deadline_slack_seconds
    # No case container outlives the gate's deadline: its wall limit is at most the time left.
    cut_by_deadline = wall > int(seconds_left)
    wall = min(wall, int(seconds_left))
    # Only the runner can read this (see gate_runner/case_env.py); a result without it is forged.
    nonce = secrets.token_hex(32)
    with _model_channel(ctx, job, case_id, inputs, seconds_left, lease, folder) as channel:
        result = _run_container(job, container, inputs, wall, nonce, channel)
        calls = list(channel.records) if channel is not None else []
    if result is None:
        return None
    ctx.metrics.container_started(result.start_ms)
    # Every value that reached the case, or its model calls, is redacted from all that is
    # stored for it.
    redactor = Redactor({**inputs.env, **inputs.secrets})
    facts = CaseFacts(
        suite=suite,
        test_name=test_name,
        nonce=nonce,
        runs=runs,
        success_threshold=success_threshold,
        wall_seconds=wall,
        cut_by_deadline=cut_by_deadline,
        gate_deadline_seconds=s.gate_deadline_seconds,
        memory_mb=s.case_memory_mb,
        output_limit_bytes=s.case_output_limit_bytes,
        reference=incidents.new_reference(),
        stop_early=inputs.stop_early,
        wilson_max_runs=cap,
    )
    outcome = case_outcome(result, facts, redactor.text)
    if isinstance(outcome, NotJudged) and outcome.ends_gate:
        # Set while this case still holds its slots: no other case of the gate may start,
        # not even while this one's outcome is being stored.
        job.halt.set()
    return partial(_store, ctx, job, case_id, outcome, redactor, result.duration_ms, calls)


@contextmanager
def _model_channel(
    ctx: WorkerContext,
    job: ClaimedJob,
    case_id: uuid.UUID,
    inputs: _CaseInputs,
    seconds_left: float,
    lease: CaseLease | None,
    folder: Path | None,
) -> Iterator[Channel | None]:
    """The case's channel to the process's model gateway, its socket in ``folder``, closed
    (and its socket gone) when the case's container has ended: a channel never outlives its
    case. None without a gateway."""
    if ctx.gateway is None or folder is None:
        yield None
        return
    channel = ctx.gateway.open_channel(
        gate_id=str(job.gate_id),
        case_id=str(case_id),
        project_id=str(inputs.project_id),
        secrets=inputs.secrets,
        routes=inputs.routes,
        egress=inputs.egress,
        api_specs=inputs.api_specs,
        deadline=time.monotonic() + seconds_left,
        waiting=lease.waiting_on_model if lease is not None else None,
        folder=folder,
    )
    try:
        yield channel
    finally:
        channel.close()


def case_limits(settings: Settings, wall_seconds: float, runtime: str | None = None) -> RunLimits:
    """A case container's limits on these settings, with its wall deadline, under
    ``runtime`` (the sandbox's; else GATE_CASE_RUNTIME): under gVisor its code's tasks are
    held by gVisor's kernel and its host pids sized for them (Settings.case_host_pids)."""
    return RunLimits(
        memory_mb=settings.case_memory_mb,
        cpus=settings.case_cpus,
        pids=settings.case_host_pids(runtime),
        guest_tasks=settings.case_guest_tasks(runtime),
        wall_seconds=wall_seconds,
        tmpfs_mb=settings.case_tmpfs_mb,
        output_limit_bytes=settings.case_output_limit_bytes,
        network=case_network(settings),
    )


def _run_container(
    job: ClaimedJob,
    container: CaseContainer,
    inputs: _CaseInputs,
    wall: int,
    nonce: str,
    channel: Channel | None,
) -> RunResult | None:
    """The case's container run; None when the job was halted under it."""
    try:
        return container.run(
            handoff.encode(
                inputs.env,
                nonce,
                gateway_token=channel.token if channel else None,
                api_tools=loader_tools(inputs.api_specs),
            ),
            wall_seconds=wall,
            halt=job.halt,
        )
    except SandboxError:  # Halted among them
        if job.halt.is_set():  # the heartbeat removed the container (cancel or lost lease)
            return None
        raise


def _mark_running(ctx: WorkerContext, job: ClaimedJob, case_id: uuid.UUID) -> float | None:
    """Mark the case running: the seconds left until the gate's deadline, or None when the
    gate was cancelled. DeadlinePassed (with nothing written) once that deadline has passed,
    whether or not the gate was also cancelled."""
    try:
        # Three statements, none loading a row into the session: the lease, the gate's
        # revision (locking the gate's row, as every write of a case does), the case.
        with job.transaction(ctx.sessions) as session:
            start = lifecycle.mark_gate_for_case(session, job.gate_id)
            # No case starts once the gate's deadline has passed, cancelled or not (the raise
            # rolls the revision back).
            left = time_left(ctx.settings, start.started_at)
            if start.cancelled:  # nothing is marked
                return None
            lifecycle.mark_case_running(session, case_id)
            return left
    except DeadlinePassed:
        job.halt.set()  # the gate's other cases do not start either
        raise


def _store(
    ctx: WorkerContext,
    job: ClaimedJob,
    case_id: uuid.UUID,
    outcome: Outcome,
    redactor: Redactor,
    duration_ms: int,
    calls: Sequence[CallRecord] = (),
) -> bool:
    """Write the case's outcome (see outcome.py) and its model calls in one fenced
    transaction: True, or DeadlinePassed once stored when the gate's deadline cut the case."""

    def store(session: Session) -> None:
        project_id = lifecycle.lock_gate_for_case_write(session, job.gate_id)
        cap = lifecycle.run_cap(session, ctx.settings, project_id)
        stored_bytes = 0
        # The gateway's record of the case's model calls, whatever became of the case: the
        # provider answered them (and the budgets counted them) either way.
        if calls:
            stored_bytes += lifecycle.save_model_calls(
                session, job.gate_id, case_id, calls, redactor, cap=cap
            )
        written = outcome
        if isinstance(written, Judged):
            try:
                # Redacted first, then cut (in save_case_result): a cut made first could
                # leave part of a secret behind.
                stored_bytes += lifecycle.save_case_result(
                    session,
                    case_id,
                    redact_result(written.result, redactor),
                    cap,
                    status=written.status,
                    successes=written.successes,
                    passed=written.passed,
                )
            except UntrustedResult as exc:  # it nests too deeply to redact or store
                written = untrusted(redactor.text(str(exc)))
        if isinstance(written, NotJudged):
            if written.log:
                log.error("case %s: %s", case_id, written.log)
            lifecycle.save_case_outcome(
                session,
                case_id,
                status=written.status,
                duration_ms=duration_ms,
                reason=written.reason,
            )
        lifecycle.count_case_write(session, job.gate_id, stored_bytes)
        ctx.metrics.case_judged(session, written.status, duration_ms)

    def store_refused(refused: StorageRefused, session: Session) -> None:
        lifecycle.lock_gate_for_case_write(session, job.gate_id)
        lifecycle.save_case_outcome(
            session,
            case_id,
            status=CaseStatus.error,
            duration_ms=duration_ms,
            reason=f"the case's result could not be stored: {refused.reason}; not retried, "
            "since the same result would be refused again",
        )
        lifecycle.count_case_write(session, job.gate_id, 0)
        ctx.metrics.case_judged(session, CaseStatus.error, duration_ms)

    try:
        _write_case(ctx, job, store)
    except StorageRefused as refused:
        _write_case(ctx, job, partial(store_refused, refused))
    if isinstance(outcome, NotJudged) and outcome.ends_gate:
        raise DeadlinePassed(ctx.settings.gate_deadline_seconds)
    return True

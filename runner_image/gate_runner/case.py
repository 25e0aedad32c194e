"""Run one test case: its `runs` invocations, each in a forked process, then the verdict.

The parent never imports user code. Each invocation forks a child that loads the project
afresh (so module state never carries over between invocations), runs the agent, and reports
plain data over a pipe (see invocations.py); the parent stops the child's run at `timeout_s`
(killing its whole process group if it has not ended after a grace) and forms every
assertion itself.

What a child reports, and what the parent adds to it (durations, limits, the builder's
context), stays plain data checked against reports.py: it is the runner's own channel. The
result of the case is built from it as the typed document of contract.py. Each invocation is
judged as it settles; with an early stop (``EarlyStop``, --stop-early) no other starts once
those judged decide the verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import BUNDLE_DEPS_DIR, NON_SUITE_DIRS, typed_json
from .assertions import (
    CompiledAssertions,
    calls_in_scope,
    check_children,
    check_result,
    check_tool_calls,
    compile_assertions,
    decode_output,
)
from .contract import MAX_CLEANUP_SECONDS, SCHEMA_VERSION, CaseResult, Invocation, Span, cut_mark
from .dataclass_code import compiled_dataclasses
from .expr import ExpressionError
from .invocations import (
    MAX_REPORT_BYTES,
    STOP_GRACE_SECONDS,
    STOP_SIGNAL,
    Channel,
    Isolation,
    Proc,
    Supervisor,
)
from .plan import AgentLimits, ConcurrencyRule, planned_case
from .reports import BUILDER, CLEANUP, INVOCATION, checked
from .sequential import wilson_applies, wilson_decision, wilson_final, wilson_reason
from .verdict import (
    STOP_MODES,
    case_failure_reason,
    case_passes,
    unjudged_reason,
    verdict_decided,
)

if TYPE_CHECKING:
    from connic.test_schema import TestFile

    from .models import GatewayChannel

MAX_LOG_LINES = 500
MAX_LOG_LINE_CHARS = 2000


MAX_STORED_STRING_CHARS = 16 * 1024
KEPT_STRING_CHARS = 1024


def compact(value: Any) -> Any:
    """Shorten long strings (base64 fixtures, huge outputs) for the stored result.

    The mark is the contract's, which the service cuts with too, so a stored run says the
    same thing, and counts the same bytes, whoever cut it.
    """
    if isinstance(value, str) and len(value) > MAX_STORED_STRING_CHARS:
        head = value[:KEPT_STRING_CHARS]
        cut = len(value.encode("utf-8", "surrogatepass")) - len(
            head.encode("utf-8", "surrogatepass")
        )
        return f"{head}{cut_mark(cut)}"
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    return value


class CaseError(Exception):
    """The case cannot be judged at all (bad reference, unknown agent, bad expression)."""


@dataclass(frozen=True)
class PreparedCase:
    suite: str
    agent_name: str
    resolved: dict[str, Any]
    assertions: CompiledAssertions
    payload: dict[str, Any]
    agent_config: AgentLimits | None = None
    # The project's agents as the light path loads them (light.py), when its plan has them,
    # and whether its code imports the SDK all the same (the plan's hint).
    light: list[dict[str, Any]] | None = None
    imports_sdk: bool = True


def suite_agent(suite_path: Path, test_file: TestFile) -> str:
    return (
        test_file.agent if isinstance(test_file.agent, str) and test_file.agent else suite_path.stem
    )


def suite_paths(project: Path) -> list[str]:
    """The suites under tests/ (not its support folders), relative to the project."""
    tests = project / "tests"
    if not tests.is_dir():
        return []
    return sorted(
        p.relative_to(project).as_posix()
        for p in tests.rglob("*")
        if p.suffix.lower() in (".yaml", ".yml")
        and p.is_file()
        and p.relative_to(tests).parts[0] not in NON_SUITE_DIRS
    )


def load_suite(project: Path, suite: str) -> TestFile:
    # Imported here: a case the image's plan holds (plan.py) needs neither.
    import yaml
    from connic.test_schema import TestFile
    from pydantic import ValidationError

    path = project / suite
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CaseError(f"{suite}: cannot read suite: {exc}") from None
    try:
        return TestFile.model_validate(raw)
    except ValidationError as exc:
        raise CaseError(f"{suite}: invalid suite: {exc}") from None


def build_payload(project: Path, case: Mapping[str, Any]) -> dict[str, Any]:
    """The payload for a static `payload` plus `files` (spec §7); builders replace it later."""
    from .builders import fixture_entries, with_files
    from .runtime import as_payload
    from .runtime_errors import AgentRunError

    text = case.get("payload")
    payload = {} if text is None else as_payload(text)
    try:
        return with_files(payload, fixture_entries(project, list(case.get("files") or [])))
    except AgentRunError as exc:
        raise CaseError(str(exc)) from None


def project_agents(project: Path) -> tuple[dict[str, Any], list[str]]:
    """Agent configs by name and load errors, read without executing any user code."""
    from connic import ProjectLoader

    loader = ProjectLoader(str(project), validation_only=True)
    try:
        agents = loader.load_agents()
    except FileNotFoundError as exc:
        return {}, [str(exc)]
    return {a.config.name: a.config for a in agents}, list(getattr(loader, "_load_errors", []))


# Decided (spec 13.16): a case's invocations run concurrently up to the agent's own
# max_concurrent_runs (default 1, so sequential unless the agent allows more), capped here.
MAX_PARALLEL_INVOCATIONS = 8


def effective_timeout(prepared: PreparedCase) -> tuple[int, str]:
    """The case's timeout_s, or the agent's own `timeout` when that is smaller (spec 13.19)."""
    case_limit = int(prepared.resolved["timeout_s"])
    agent_limit = prepared.agent_config.timeout if prepared.agent_config else None
    if agent_limit is not None and agent_limit < case_limit:
        return agent_limit, "the agent's timeout"
    return case_limit, "timeout_s"


def cleanup_budget(prepared: PreparedCase) -> int:
    """The time a builder's cleanup may take after the agent is done: timeout_s, capped."""
    return min(int(prepared.resolved["timeout_s"]), MAX_CLEANUP_SECONDS)


def parallelism(prepared: PreparedCase, runs: int) -> int:
    allowed = prepared.agent_config.max_concurrent_runs if prepared.agent_config else 1
    if concurrency_rule(prepared) is not None and prepared.resolved.get("builder"):
        # A builder's payload, and so its key, is only known inside its invocation, once
        # build() has run: one at a time, no two runs can share a key's turn.
        allowed = 1
    return max(1, min(runs, allowed, MAX_PARALLEL_INVOCATIONS))


def concurrency_rule(prepared: PreparedCase) -> ConcurrencyRule | None:
    return prepared.agent_config.concurrency if prepared.agent_config else None


def key_value(payload: Any, path: str) -> str | None:
    """The concurrency key's value in a payload, as JSON, or None when the path is not there.

    The SDK's key is a dot-path into the trigger payload (`process_id`, `data.customer_id`);
    the vendor's examples also write `input.process_id`, so a leading `input.` is the
    payload itself when the payload has no `input` key.
    """
    parts = path.split(".")
    if (
        parts[0] == "input"
        and len(parts) > 1
        and not (isinstance(payload, Mapping) and "input" in payload)
    ):
        parts = parts[1:]
    value = payload
    for part in parts:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return json.dumps(value, sort_keys=True, default=repr)


class Admission:
    """Which of a case's invocations starts next, under the agent's concurrency rule.

    An invocation arrives when a slot under max_concurrent_runs is free for it, in order.
    One that arrives on a key an invocation in flight holds meets `on_conflict` (SDK
    ConcurrencyConfig): 'queue' waits for the active run (a later one whose key is free may
    go first), 'drop' cancels the new run, 'coalesce' keeps at most one waiting run per key,
    replaced by newer ones; one that waited for its key goes first once it is free.
    """

    def __init__(self, runs: int, rule: ConcurrencyRule | None, value: str | None) -> None:
        self.rule = rule
        self.pending = list(range(runs))
        self.keys = dict.fromkeys(range(runs), value)  # each invocation's key value
        self.parked: dict[str, int] = {}  # coalesce: the one run waiting for each key
        self.cancelled: list[tuple[int, str]] = []

    def waiting(self) -> bool:
        return bool(self.pending or self.parked)

    def take_cancelled(self) -> list[tuple[int, str]]:
        """The invocations cancelled since the last call, with why."""
        taken, self.cancelled = self.cancelled, []
        return taken

    def _holder(self, index: int, running: set[int]) -> int | None:
        key = self.keys[index]
        if key is None:
            return None
        return next((i for i in sorted(running) if self.keys[i] == key), None)

    def next(self, running: set[int]) -> int | None:
        """The invocation to start now, given those ``running``; None when none may."""
        for key, index in list(self.parked.items()):
            if self._holder(index, running) is None:
                del self.parked[key]
                return index
        while self.pending:
            index = self.pending[0]
            held_by = self._holder(index, running)
            if held_by is None or self.rule is None:
                return self.pending.pop(0)
            rule, key = self.rule, str(self.keys[index])
            conflict = (
                f"the agent's concurrency rule: key {rule.key} = {key} was held by "
                f"invocation {held_by + 1}; on_conflict: {rule.on_conflict}"
            )
            if rule.on_conflict == "drop":
                self.pending.pop(0)
                self.cancelled.append((index, f"dropped by {conflict}"))
            elif rule.on_conflict == "coalesce":
                self.pending.pop(0)
                older = self.parked.get(key)
                if older is not None:
                    self.cancelled.append(
                        (
                            older,
                            f"replaced while it waited by invocation {index + 1} ({conflict} "
                            "keeps one waiting run per key, the newest)",
                        )
                    )
                self.parked[key] = index
            else:  # queue
                free = next((i for i in self.pending if self._holder(i, running) is None), None)
                if free is not None:
                    self.pending.remove(free)
                return free
        return None


def _not_run(error: str) -> dict[str, Any]:
    """An invocation the agent's concurrency rule cancelled before it started."""
    return {
        "status": "cancelled",
        "output": None,
        "error": error,
        "run_context": {},
        "traces": [],
        "duration_ms": 0,
    }


def check_case(
    project: Path,
    suite: str,
    case_name: str,
    agent: str,
    resolved: Mapping[str, Any],
    agents: Mapping[str, Any],
) -> CompiledAssertions:
    """What makes a resolved case unjudgeable before it runs (CaseError), in this order."""
    if agent not in agents:
        known = ", ".join(sorted(agents)) or "none"
        raise CaseError(f"{suite}: agent {agent!r} does not exist (agents: {known})")
    builder = resolved.get("builder")
    if (
        builder
        and not (project / "tests" / "builders" / f"{builder.removesuffix('.py')}.py").is_file()
    ):
        raise CaseError(
            f"{suite}: builder tests/builders/{builder.removesuffix('.py')}.py does not exist"
        )
    try:
        return compile_assertions(resolved)
    except ExpressionError as exc:
        raise CaseError(f"{suite}: case {case_name!r}: {exc}") from None


def agent_limits(config: Any) -> AgentLimits:
    """What the runner's parent reads of an agent's config, read as before from the SDK's."""
    timeout = getattr(config, "timeout", None)
    rule = getattr(config, "concurrency", None)
    key = getattr(rule, "key", None)
    return AgentLimits(
        timeout=timeout if isinstance(timeout, int) else None,
        max_concurrent_runs=int(getattr(config, "max_concurrent_runs", 1) or 1),
        concurrency=ConcurrencyRule(key=key, on_conflict=str(getattr(rule, "on_conflict", "queue")))
        if isinstance(key, str) and key
        else None,
    )


def prepare(
    project: Path, suite: str, case_name: str, plan: Mapping[str, Any] | None = None
) -> PreparedCase:
    """The case ready to run: from the project's plan (plan.py) when that holds the case,
    else from its suite."""
    planned = planned_case(plan, suite, case_name) if plan is not None else None
    # The light path is the project's, whichever way the case itself is prepared.
    light = plan.get("light") if plan is not None else None
    imports_sdk = bool(plan.get("imports_sdk", True)) if plan is not None else True
    if planned is not None:
        if planned.error is not None:
            raise CaseError(planned.error)
        assert planned.resolved is not None
        return PreparedCase(
            agent_config=planned.agent,
            suite=suite,
            agent_name=planned.agent_name,
            resolved=planned.resolved,
            assertions=compile_assertions(planned.resolved),
            payload=build_payload(project, planned.resolved),
            light=light,
            imports_sdk=imports_sdk,
        )
    test_file = load_suite(project, suite)
    matches = [c for c in test_file.tests if c.name == case_name]
    if not matches:
        raise CaseError(f"{suite}: no case named {case_name!r}")
    resolved = test_file.resolved(matches[0])
    agent = suite_agent(Path(suite), test_file)
    names, _errors = project_agents(project)
    assertions = check_case(project, suite, case_name, agent, resolved, names)
    return PreparedCase(
        agent_config=agent_limits(names[agent]),
        suite=suite,
        agent_name=agent,
        resolved=resolved,
        assertions=assertions,
        payload=build_payload(project, resolved),
        light=light,
        imports_sdk=imports_sdk,
    )


def _setup_failure(stage: str, exc: BaseException) -> dict[str, Any]:
    """The test's own setup broke (project, mocks, builder): never the agent's failure."""
    message = f"{stage} raised {type(exc).__name__}: {exc}"
    return {
        "status": "failed",
        "output": None,
        "error": message,
        "run_context": {},
        "traces": [],
        "setup_error": f"{message}\n{traceback.format_exc(limit=8)}",
    }


def _invocation_body(
    project: Path,
    prepared: PreparedCase,
    model_mode: str | None,
    gateway: GatewayChannel | None,
    api_tools: Mapping[str, Any],
    guardrail_model: str | None,
    channel: Channel,
) -> None:
    """What a forked invocation runs: the agent, then a builder's cleanup; reports over pipe."""
    data: dict[str, Any] | None = None
    timeout_s, which = effective_timeout(prepared)
    stop = f"timed out after {timeout_s} s ({which})"
    runtime: Any = None

    def stopped(signum: int, frame: Any) -> None:
        # The runner's stop at timeout_s (issue 39): the run in progress ends failed with
        # `stop` (and its middleware cleanup runs); once it has ended, nothing is interrupted.
        from .runtime_errors import InvocationTimedOut

        if channel.busy:  # never in the middle of a report's line: once it is whole
            channel.deferred = functools.partial(stopped, signum, frame)
            return
        if runtime is not None:
            runtime.stopping = stop
            if runtime.ending:
                return
        raise InvocationTimedOut(stop)

    signal.signal(STOP_SIGNAL, stopped)
    try:
        from .approvals import Approvals
        from .builders import fixture_entries, load_builder, run_build, run_cleanup, with_files
        from .mocks import Mocks, StrictFlags
        from .runtime import Runtime, Trace, install_predefined, jsonable
        from .runtime.sdk import after_sdk_import

        # The bundle's own dependencies come after the runner's: a wheel cannot shadow the
        # runner's modules, and no .pth file in it is ever processed.
        if BUNDLE_DEPS_DIR not in sys.path:
            sys.path.append(BUNDLE_DEPS_DIR)
        trace = Trace()
        runtime = Runtime(
            {},
            project=project,
            model_mode=model_mode,
            gateway=gateway,
            guardrail_model=guardrail_model,
        )
        if prepared.resolved.get("builder"):
            trace.watch = _context_reporter(runtime, channel)
        # Before user modules import connic.tools names; if the SDK is imported at all.
        after_sdk_import(lambda: install_predefined(runtime))
        resolved = prepared.resolved
        payload, builder = prepared.payload, None
        context: dict[str, Any] = {}
        stage = "loading the project"
        try:
            _load_project(runtime, project, prepared, api_tools)
            stage = f"the mocks module {resolved.get('mocks')!r}"
            runtime.mocks = Mocks.load(
                project,
                resolved.get("mocks"),
                StrictFlags(
                    tools=bool(resolved.get("strict_mocks")),
                    hooks=bool(resolved.get("strict_hook_mocks")),
                    middleware=bool(resolved.get("strict_middleware_mocks")),
                    guardrails=bool(resolved.get("strict_guardrail_mocks")),
                ),
            )
            if resolved.get("builder"):
                stage = f"builder {resolved['builder']!r} build()"
                builder = load_builder(project, resolved["builder"])
                built = run_build(builder, resolved, context)
                files = fixture_entries(project, list(resolved.get("files") or []))
                payload = with_files(built, files)
                # Reported now, so that a cleanup after a timeout or crash still has the
                # context, and assertions see the context exactly as build() left it.
                channel.send(
                    "builder", {"context": typed_json.encode(context), "input": jsonable(payload)}
                )
        except BaseException as exc:
            data = _setup_failure(stage, exc)
        if data is None:
            runtime.approvals = Approvals.from_case(resolved, context)
            outcome = runtime.run(prepared.agent_name, payload, trace)
            runtime.violations.extend(runtime.approvals.problems)
            if runtime.approvals.strict:
                for left in runtime.approvals.unused():
                    runtime.violations.append(
                        f"strict_approval_decisions: the decision for {left.tool} "
                        f"({left.decision}) was never used"
                    )
            stopped_at_timeout = runtime.stopping is not None
            data = {
                "status": outcome.status,
                "input": jsonable(payload),
                "output": jsonable(outcome.output),
                "error": outcome.error,
                "provider_failure": outcome.provider_failure,
                "run_context": jsonable(outcome.run_context),
                "traces": [s.as_json() for s in trace.spans],
                "violations": list(runtime.violations),
            }
            if builder is not None and not stopped_at_timeout:
                # The agent's part is reported before cleanup runs: a cleanup that hangs then
                # costs only itself, and is never run a second time. (After a stop at
                # timeout_s the runner runs it in a fresh process, with its own budget.)
                channel.send("agent", data)
                # cleanup sees the parsed output (spec 8.1), as assertions do.
                run = {
                    "input": payload,
                    "output": decode_output(outcome.output),
                    "context": outcome.run_context,
                }
                data["cleanup_failure"] = run_cleanup(builder, resolved, context, run)
    except BaseException as exc:
        data = _setup_failure("the runner", exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # user code may have closed or replaced it
            pass
    channel.send("result", data)


def _load_project(
    runtime: Any, project: Path, prepared: PreparedCase, api_tools: Mapping[str, Any]
) -> None:
    """The project's agents into ``runtime``: without the SDK when the plan says the project
    needs none of it (light.py), else, or when the light path cannot tell, with its loader."""
    light = None
    if prepared.light is not None:
        from .light import Fallback, LightLoad, LightLoader

        light = LightLoad(project.resolve())
        try:
            agents = light.agents(prepared.light)
        except Fallback:
            pass  # the SDK's loader decides, reusing what was imported
        else:
            if prepared.agent_name in agents:  # else the SDK's loader says why it is not
                runtime.agents, runtime.loader = agents, LightLoader()
                return
    from connic import ProjectLoader

    # api: tools resolve against the project's specs (the SDK loader's registry).
    loader = ProjectLoader(str(project), api_spec_tools=dict(api_tools) or None)
    if light is not None:
        light.hand_over(loader)
    runtime.agents = {a.config.name: a for a in loader.load_agents()}
    runtime.loader = loader
    if prepared.agent_name not in runtime.agents:
        errors = list(getattr(loader, "_load_errors", []))
        raise RuntimeError("; ".join(errors) or f"agent {prepared.agent_name} not loaded")


# What one invocation may spend on reporting its run context as it changes: past it, the
# last one sent stands (the report channel holds MAX_REPORT_BYTES in all).
MAX_CONTEXT_REPORT_BYTES = 4 * 1024 * 1024


def _context_reporter(runtime: Any, channel: Channel) -> Any:
    """At each step of the run (each span opened), the outermost run's context, when it
    changed, to the runner: a builder's cleanup after a timeout or a crash gets it (seed 001:
    `run["context"]` is the run's run_context). Without `payload`, which the runner has."""
    from .runtime import jsonable

    lock = threading.Lock()
    last: list[str] = [""]
    spent = [0]

    def report() -> None:
        context = runtime.root_context
        if context is None or spent[0] > MAX_CONTEXT_REPORT_BYTES:
            return
        try:
            plain = {k: jsonable(v) for k, v in list(context.items()) if k != "payload"}
            text = json.dumps(plain, sort_keys=True, default=repr)
        except Exception:  # changed by another thread meanwhile: the next step reports it
            return
        with lock:
            if text == last[0]:
                return
            last[0] = text
            spent[0] += len(text)
            channel.send("run_context", plain)

    return report


def _late_cleanup_body(
    project: Path,
    prepared: PreparedCase,
    built: dict[str, Any],
    context: dict[str, Any],
    channel: Channel,
) -> None:
    """cleanup() for an invocation that timed out or crashed, with the context build() left
    and the run's context as the invocation last reported it."""
    from .builders import load_builder, run_cleanup

    module = load_builder(project, prepared.resolved["builder"])
    run = {"input": built["input"], "output": None, "context": context}
    channel.send(
        "cleanup", {"failure": run_cleanup(module, prepared.resolved, built["context"], run)}
    )


def _log_spans(proc: Proc) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    for stream, level in (("stdout", "INFO"), ("stderr", "ERROR")):
        for raw in proc.stream_text(stream).splitlines():
            if len(spans) >= MAX_LOG_LINES:
                return spans
            line = raw[:MAX_LOG_LINE_CHARS].decode("utf-8", "replace")
            spans.append({"stream": stream, "level": level, "message": line})
    return spans


def _agent_data(prepared: PreparedCase, proc: Proc, reports: dict[str, Any]) -> dict[str, Any]:
    """What the invocation process reported, or what its end says when it did not."""
    timeout_s, which = effective_timeout(prepared)
    agent, agent_problem = checked(reports, "agent", INVOCATION)
    result, result_problem = checked(reports, "result", INVOCATION)
    if proc.timed_out and agent is not None:
        # The agent finished; its builder cleanup is what ran out of time.
        agent["cleanup_failure"] = f"builder cleanup timed out after {cleanup_budget(prepared)} s"
        return agent
    malformed = agent_problem or result_problem
    if malformed:
        error = f"the invocation's report is malformed: {malformed}"
    elif proc.timed_out and result is not None:
        # Stopped at its timeout, the run ended within the grace (issue 39): what it
        # reported stands (its spans, its middleware cleanup's violations), as a timeout.
        result.pop("setup_error", None)  # a stop during load or build() is no broken setup
        result.pop("provider_failure", None)  # the timeout is what ended it
        result.update(
            status="failed", output=None, error=f"timed out after {timeout_s} s ({which})"
        )
        return result
    elif proc.timed_out:
        error = f"timed out after {timeout_s} s ({which})"
    elif result is not None:
        return result
    elif proc.report_overflow:
        error = f"the invocation's report was larger than {MAX_REPORT_BYTES} bytes"
    else:
        error = f"the invocation process {proc.exit_description()} before reporting"
    return {"status": "failed", "output": None, "error": error, "run_context": {}, "traces": []}


@dataclass
class _Invocation:
    """One invocation in flight: its agent process, then perhaps a late cleanup process."""

    index: int
    agent: Proc
    data: dict[str, Any] | None = None
    cleanup: Proc | None = None


def _run_invocations(
    project: Path,
    prepared: PreparedCase,
    runs: int,
    parallel: int,
    isolation: Isolation,
    model_mode: str | None,
    stop: EarlyStop | None = None,
) -> list[JudgedInvocation]:
    """The invocations, at most ``parallel`` at once, each in its own process group, each
    judged as it settles: all ``runs`` of them, or, once ``stop`` is reached, those started
    (or cancelled by the concurrency rule) by then, which are the first ones (admission goes
    in index order: ``Admission``).

    One loop reads every pipe and enforces every deadline; nothing in it blocks on one
    invocation, so a slow cleanup never delays another invocation's timeout.
    """
    early = stop if stop is not None else EarlyStop(None, runs, 100)
    with contextlib.closing(Supervisor(isolation)) as supervisor:
        results: dict[int, dict[str, Any]] = {}
        in_flight: dict[Proc, _Invocation] = {}

        def settle(index: int, data: dict[str, Any]) -> None:
            results[index] = data
            early.settle(judge_settled(prepared, index, data))

        builder = bool(prepared.resolved.get("builder"))
        timeout_s = effective_timeout(prepared)[0]
        unswept: list[int] = []  # invocations that ended since the last sweep
        rule = concurrency_rule(prepared)
        # A static payload's key value is known now (a builder's case runs one at a time,
        # see parallelism()); None is no key, bounded only by max_concurrent_runs.
        value = None if rule is None or builder else key_value(prepared.payload, rule.key)
        admission = Admission(runs, rule, value)

        def sweep() -> None:
            # Nothing of the last invocation(s) survives into the next; if something did, the
            # invocations that may have left it fail.
            if not supervisor.sweep():
                for index in unswept:
                    results[index].setdefault("limit_failures", []).append(
                        "the invocation left processes behind that could not be killed"
                    )
                    settle(index, results[index])  # judged again: it fails now
            unswept.clear()

        while True:
            if not supervisor.active:
                sweep()
            # Once the invocations settled decide the verdict (--stop-early), no other one
            # starts and those in flight finish; asked again after each sweep, which may fail
            # an invocation judged a pass.
            if not in_flight and not (admission.waiting() and not early.reached()):
                break
            while (
                len(running := {inv.index for inv in in_flight.values()}) < parallel
                and admission.waiting()
                and not early.reached()
            ):
                started = admission.next(running)
                for cancelled, why in admission.take_cancelled():
                    settle(cancelled, _not_run(why))
                if started is None:
                    break
                index = started
                try:
                    proc = supervisor.spawn(
                        functools.partial(
                            _invocation_body,
                            project,
                            prepared,
                            model_mode,
                            isolation.gateway,
                            isolation.api_tools,
                            isolation.guardrail_model,
                        ),
                        timeout_s=timeout_s,
                        after_agent_seconds=cleanup_budget(prepared) if builder else None,
                        stop_grace_seconds=STOP_GRACE_SECONDS,
                    )
                except OSError as exc:  # the pids limit, say: this invocation cannot start
                    settle(index, _not_started(exc))
                    continue
                in_flight[proc] = _Invocation(index, proc)
            for proc in supervisor.wait():
                inv = in_flight.pop(proc)
                if inv.cleanup is proc:
                    assert inv.data is not None
                    late, late_problem = checked(proc.messages(), "cleanup", CLEANUP)
                    failure: str | None
                    if proc.timed_out:
                        failure = f"builder cleanup timed out after {cleanup_budget(prepared)} s"
                    elif late is not None:
                        failure = late.get("failure")
                    elif late_problem:
                        failure = f"builder cleanup's report is malformed: {late_problem}"
                    else:
                        failure = "builder cleanup could not run after the invocation ended"
                    inv.data["cleanup_failure"] = failure
                    settle(inv.index, inv.data)
                    unswept.append(inv.index)
                    continue
                reports = proc.messages()
                data = _agent_data(prepared, proc, reports)
                data["duration_ms"] = int((proc.ended_at - proc.started) * 1000)
                data["limit_failures"] = supervisor.limit_failures(proc)
                built, built_problem = checked(reports, "builder", BUILDER)
                if built_problem:
                    data["limit_failures"].append(
                        f"the builder's report is malformed: {built_problem}"
                    )
                if built is not None:
                    # As build() left it: Decimals, tuples and int keys survive the crossing.
                    built["context"] = typed_json.decode(built.get("context"))
                    data["builder_context"] = built["context"]
                    data.setdefault("input", built.get("input"))
                traces = list(data.get("traces") or [])
                parent = traces[0]["span_id"] if traces else None
                for line in _log_spans(proc):
                    traces.append(
                        {
                            "span_id": f"s{len(traces) + 1}",
                            "parent_span_id": parent,
                            "span_order": len(traces) + 1,
                            "type": "log",
                            "name": line["stream"],
                            "status": "ok",
                            "duration_ms": 0,
                            "metadata": {"level": line["level"], "message": line["message"]},
                        }
                    )
                data["traces"] = traces
                inv.data = data
                if built is not None and "cleanup_failure" not in data and "agent" not in reports:
                    # The invocation died before its own cleanup began: run it in a fresh process.
                    try:
                        inv.cleanup = supervisor.spawn(
                            functools.partial(
                                _late_cleanup_body,
                                project,
                                prepared,
                                built,
                                _last_run_context(data, reports, built),
                            ),
                            timeout_s=cleanup_budget(prepared),
                        )
                    except OSError as exc:
                        data["cleanup_failure"] = f"builder cleanup could not start: {exc}"
                    else:
                        in_flight[inv.cleanup] = inv
                        continue
                settle(inv.index, data)
                unswept.append(inv.index)
        # The first invocations, all of them without an early stop (a gap, which admission in
        # index order never leaves, would be refused by the worker, not hidden here).
        return [early.judged[i] for i in sorted(results)]


def _last_run_context(
    data: Mapping[str, Any], reports: Mapping[str, Any], built: Mapping[str, Any]
) -> dict[str, Any]:
    """The run context for a late builder cleanup (issue 39): the ended run's, when the
    invocation reported its end (stopped at timeout_s), else the last it reported as the
    run went on (killed, crashed), with the payload put back; {} if the run never began."""
    ended = data.get("run_context")
    if isinstance(ended, dict) and ended:
        return dict(ended)
    last = reports.get("run_context")
    if not isinstance(last, dict) or not last:
        return {}
    return {**last, "payload": built.get("input")}


def _not_started(exc: OSError) -> dict[str, Any]:
    return {
        "status": "failed",
        "output": None,
        "error": f"the invocation could not start: {exc}",
        "run_context": {},
        "traces": [],
        "duration_ms": 0,
    }


def judge_invocation(prepared: PreparedCase, data: Mapping[str, Any]) -> list[str]:
    """Every failed assertion of one invocation, in the order the spec lists them."""
    builder_context: dict[str, Any] = dict(data.get("builder_context") or {})
    failures: list[str] = []
    result_failure = check_result(
        prepared.assertions.expected_result,
        status=data["status"],
        output=data.get("output"),
        error=data.get("error"),
        context=builder_context,
    )
    violations = [str(v) for v in data.get("violations") or []]
    if result_failure == f"agent error: {data.get('error')}" and data.get("error") in violations:
        # The run failed because of a strict-flag or signature violation, which is reported
        # below on its own: say it once (issue 10, rule 8).
        result_failure = None
    spans = list(data.get("traces") or [])
    if result_failure and data["status"] == "awaiting_approval":
        pending = [
            s
            for s in spans
            if s.get("type") == "tool_call"
            and s.get("metadata", {}).get("not_executed") == "awaiting approval"
        ]
        if pending:
            meta = pending[-1]["metadata"]
            params = json.dumps(meta.get("params"), default=repr)
            if meta.get("approval_input"):
                asked = f'the input request {meta.get("tool_ref")} ("{meta.get("label")}")'
            else:
                asked = f"the approval of {meta.get('tool_ref')}"
            result_failure += f"; {asked} with params {params} was never answered"
            skipped = [
                why
                for s in spans
                if s.get("type") == "approval" and s.get("parent_span_id") == pending[-1]["span_id"]
                for why in s.get("metadata", {}).get("skipped") or []
            ]
            if skipped:
                result_failure += f" ({'; '.join(skipped)})"
    skipped = [
        f"{s.get('name')} ({s.get('metadata', {}).get('direction')})"
        for s in spans
        if s.get("type") == "guardrail" and s.get("status") == "skipped"
    ]
    if result_failure and skipped:
        # The outcome may be what a provider-backed rule would have changed: say it was not
        # judged here, rather than leave "status = completed" unexplained (issue 10, rule 8).
        result_failure += (
            f"; guardrail(s) {', '.join(sorted(set(skipped)))} need a provider the gate does "
            "not call and were skipped"
        )
    if result_failure:
        failures.append(result_failure)
    calls = calls_in_scope(spans, None)  # the agent under test's own calls, not its children's
    failures.extend(check_tool_calls(prepared.assertions, calls, builder_context))
    failures.extend(
        check_children(prepared.assertions.expected_child_agents, spans, builder_context)
    )
    if data.get("setup_error"):
        # Whatever expected_result says (even `status == "failed"`), a broken setup fails.
        failures.insert(0, str(data["setup_error"]))
    failures.extend(violations)
    failures.extend(str(v) for v in data.get("limit_failures") or [])
    if data.get("cleanup_failure"):
        failures.append(str(data["cleanup_failure"]))
    return failures


def _judged(prepared: PreparedCase, index: int, data: Mapping[str, Any]) -> Invocation:
    """One invocation of the result document: judged on the full data, stored compacted.

    ``data`` is the invocation process's report (checked against reports.py) with what the
    runner adds to it; the result document is built from it here, typed.
    """
    failures = judge_invocation(prepared, data)
    # Compacted, so that fixtures echoed into input, context and spans cannot blow the result
    # past the container's output cap.
    return Invocation(
        index=index,
        status=data["status"],
        passed=not failures,
        input=compact(data.get("input", prepared.payload)),
        output=compact(data.get("output")),
        error=compact(data.get("error")),
        failure_reason="; ".join(failures) if failures else None,
        failed_assertions=failures,
        run_context=compact(data.get("run_context") or {}),
        duration_ms=data["duration_ms"],
        traces=[Span(**compact(span)) for span in data["traces"]],
    )


@dataclass(frozen=True)
class JudgedInvocation:
    """One invocation of the result, judged, and what the verdict reads beside it."""

    invocation: Invocation
    # The provider's reason when the invocation failed because a model call failed outside
    # the agent (verdict.unjudged_reason); None for a pass or the agent's own failure.
    provider_failure: str | None = None


def judge_settled(prepared: PreparedCase, index: int, data: Mapping[str, Any]) -> JudgedInvocation:
    """``_judged``, and a report that fits its shape and still breaks judging failed as a
    broken setup (whatever expected_result says)."""
    try:
        invocation = _judged(prepared, index, data)
    except Exception as exc:
        why = (
            "the runner could not judge this invocation's report: "
            f"{type(exc).__name__}: {str(exc)[:300]}"
        )
        invocation = _judged(
            prepared,
            index,
            {
                "status": "failed",
                "error": why,
                "setup_error": why,
                "traces": [],
                "duration_ms": data.get("duration_ms", 0),
            },
        )
    provider = data.get("provider_failure")
    failed_outside = invocation.failure_reason is not None and bool(provider)
    return JudgedInvocation(invocation, str(provider) if failed_outside else None)


class EarlyStop:
    """Whether a case's invocations judged so far decide its verdict by ``mode`` (the
    runner's --stop-early; verdict.verdict_decided), so that no other may start.

    Fed each invocation as it settles, in any order: the counts only grow, except when the
    sweep after an invocation adds a failure to one judged a pass, which re-settles it.
    Without a mode, or with one run, it never stops.
    """

    def __init__(self, mode: str | None, runs: int, success_threshold: int) -> None:
        if mode is not None and mode not in STOP_MODES:
            raise ValueError(f"the stop mode must be one of {', '.join(STOP_MODES)}, got {mode!r}")
        self.mode = mode if runs > 1 else None
        self.runs = runs
        self.success_threshold = success_threshold
        self.judged: dict[int, JudgedInvocation] = {}

    def settle(self, judged: JudgedInvocation) -> None:
        self.judged[judged.invocation.index] = judged

    def reached(self) -> bool:
        if self.mode is None:
            return False
        successes = sum(1 for j in self.judged.values() if j.invocation.passed)
        agent_failures = sum(
            1
            for j in self.judged.values()
            if not j.invocation.passed and j.provider_failure is None
        )
        return verdict_decided(
            self.mode,
            runs=self.runs,
            success_threshold=self.success_threshold,
            successes=successes,
            agent_failures=agent_failures,
        )


def case_verdict(
    runs: int, success_threshold: int, judged: list[JudgedInvocation]
) -> tuple[int, bool, str | None, str | None]:
    """(successes, passed, case_error, failure_reason) of the case from its invocations
    (all of its ``runs``, or the first of them after an early stop): always against the full
    ``runs``."""
    reasons = [j.invocation.failure_reason for j in judged]
    successes = sum(1 for r in reasons if r is None)
    unjudged = unjudged_reason(
        runs=runs,
        success_threshold=success_threshold,
        successes=successes,
        provider_failures=[
            (j.invocation.index, j.provider_failure)
            for j in judged
            if j.provider_failure is not None
        ],
    )
    reason = unjudged or case_failure_reason(
        runs=runs, success_threshold=success_threshold, invocation_reasons=reasons
    )
    return successes, case_passes(successes, runs, success_threshold), unjudged, reason


def wilson_verdict(
    runs: int, success_threshold: int, max_runs: int, judged: list[JudgedInvocation]
) -> tuple[int, bool, str | None, str | None]:
    """``case_verdict`` under the Wilson rule (sequential.py), over every invocation run: a
    case whose verdict its provider failures decide (it fails, and would pass were they
    passes) is not judged, as under the platform's rule."""
    ran = len(judged)
    successes = sum(1 for j in judged if j.invocation.passed)
    passed = wilson_final(successes, ran, success_threshold)
    unjudged = unjudged_reason(
        runs=ran,
        success_threshold=success_threshold,
        successes=successes,
        provider_failures=[
            (j.invocation.index, j.provider_failure) for j in judged if j.provider_failure
        ],
        passes=wilson_final,
    )
    reason = unjudged or wilson_reason(successes, ran, runs, success_threshold, max_runs)
    if reason is not None and unjudged is None:
        first = next(j.invocation for j in judged if j.invocation.failure_reason is not None)
        reason += f"; first failure (invocation {first.index + 1}): {first.failure_reason}"
    return successes, passed, unjudged, reason


def runner_imports() -> None:
    """Import the runner's modules of the run-case path: every one an invocation uses, so
    they are imported once before the invocations fork (_preload), and, in a case
    container, with their dataclass code from the image (__main__, dataclass_code.py)."""
    from . import approvals, builders, case_env, contract, invocations, mocks  # noqa: F401
    from .runtime import orchestrator, tool_agent, triggers  # noqa: F401


def later_runner_imports() -> None:
    """The runner's modules that a case imports only when it needs them (the light path, a
    live model's gateway client, an LLM agent's loop): collected with runner_imports' at
    image build (dataclass_code.py), and lent that code where they are imported."""
    from . import light, models  # noqa: F401
    from .runtime import llm  # noqa: F401


def _preload(prepared: PreparedCase, runs: int) -> None:
    """Import here, before the invocations fork, what each of them would import: once, not
    once per invocation. Only the runner's own modules and the SDK: this process still runs
    no user code."""
    runner_imports()  # in a case container, __main__ has imported them already
    if prepared.light is None or prepared.imports_sdk:
        # Every invocation imports the SDK (its loader, or the project's code), never with
        # the runner's dataclass code lent.
        import connic  # noqa: F401
    with compiled_dataclasses():
        if prepared.light is not None:
            from . import light  # noqa: F401
        if runs > 1:
            # An LLM agent's loop and model clients, which a one-run case leaves to its
            # invocation (to the agents that use them).
            from .runtime import llm  # noqa: F401


def run_case(
    project: Path,
    suite: str,
    case_name: str,
    isolation: Isolation | None = None,
    model_mode: str | None = None,
    plan: Mapping[str, Any] | None = None,
    stop_early: str | None = None,
    wilson_max_runs: int | None = None,
) -> CaseResult:
    """Run a case and return its result document (contract.py), without the worker's nonce.

    ``model_mode`` forces one mode on every LLM agent (the gate's); unset, GATE_MODEL_MODE of
    this process decides (`gate record`, in-process tests), else each agent's own.
    ``plan``: the project's plan (plan.py; a test image has one), if any.
    ``stop_early``: a mode of verdict.STOP_MODES (--stop-early): no invocation starts once
    those judged decide the verdict that way, and the result holds the first invocations
    only (those in flight then finish); None runs every invocation.
    ``wilson_max_runs``: the project's ``verdict_rule: wilson`` (--wilson-max-runs): a case it
    applies to (sequential.wilson_applies) runs more invocations, one at a time, while its
    interval holds its threshold, up to this many in all, and is judged by the interval (no
    early stop then).
    """
    started = time.monotonic()
    try:
        prepared = prepare(project, suite, case_name, plan)
    except CaseError as exc:
        return CaseResult(
            schema_version=SCHEMA_VERSION,
            suite=suite,
            test_name=case_name,
            agent_name=None,
            runs=0,
            success_threshold=100,
            successes=0,
            passed=False,
            case_error=str(exc),
            failure_reason=str(exc),
            duration_ms=int((time.monotonic() - started) * 1000),
            invocations=[],
        )
    runs = int(prepared.resolved["runs"])
    threshold = int(prepared.resolved["success_threshold"])
    _preload(prepared, runs)
    wilson_max = wilson_max_runs if wilson_max_runs and wilson_applies(runs, threshold) else None
    isolation = isolation or Isolation()
    model_mode = model_mode or os.environ.get("GATE_MODEL_MODE") or None
    judged = _run_invocations(
        project,
        prepared,
        runs,
        parallelism(prepared, runs),
        isolation,
        model_mode,
        EarlyStop(None if wilson_max else stop_early, runs, threshold),
    )
    if wilson_max is None:
        successes, passed, unjudged, reason = case_verdict(runs, threshold, judged)
    else:
        while (
            wilson_decision(
                sum(1 for j in judged if j.invocation.passed),
                len(judged),
                runs,
                threshold,
                wilson_max,
            )
            == "more"
        ):
            (more,) = _run_invocations(
                project, prepared, 1, 1, isolation, model_mode, EarlyStop(None, 1, threshold)
            )
            # Run alone, it is invocation 0 of its own; it is the next of the case's.
            numbered = dataclasses.replace(more.invocation, index=len(judged))
            judged.append(JudgedInvocation(numbered, more.provider_failure))
        successes, passed, unjudged, reason = wilson_verdict(runs, threshold, wilson_max, judged)
    return CaseResult(
        schema_version=SCHEMA_VERSION,
        suite=suite,
        test_name=case_name,
        agent_name=prepared.agent_name,
        runs=runs,
        success_threshold=threshold,
        successes=successes,
        passed=passed,
        case_error=unjudged,
        failure_reason=reason,
        duration_ms=int((time.monotonic() - started) * 1000),
        invocations=[j.invocation for j in judged],
    )

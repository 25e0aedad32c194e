"""A case's stored outcome, decided in one place from what its container left.

``case_outcome`` is a pure function: the sandbox's facts about the container (exit, timeout,
out of memory, output cut, stdout), the limits the worker set, the nonce it handed in, and
the suite it validated go in; what to store comes out. It touches no database and no engine,
so every branch is a unit test (tests/unit/test_case_outcome.py), and the handler's part is
mark -> run -> store.

The order is the order of trust: a container the engine stopped (the gate's deadline, the
case's own, the memory limit) has no result to read; a cut or doubled output, or one from a
container that did not exit 0, is not the runner's; only then is the one result block read,
checked against the nonce, the suite and the case, and its verdict recomputed from the runs
and threshold the worker validated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gate_runner.contract import CaseResult

from .. import incidents
from ..models import CaseStatus
from ..runner_contract import (
    RunnerOutputError,
    UntrustedResult,
    parse_runner_output,
    result_blocks,
    trusted_verdict,
)
from ..sandbox import RunResult

STDERR_TAIL_CHARS = 1500  # of a broken runner's stderr, kept for the worker log


@dataclass(frozen=True)
class CaseFacts:
    """What the worker set up for one case's container, beside what the container did."""

    suite: str
    test_name: str
    nonce: str  # handed to the runner; a result without it is forged
    runs: int  # from the suite the worker validated, never from the result
    success_threshold: int
    wall_seconds: int  # the container's hard deadline
    cut_by_deadline: bool  # the wall limit is the gate's time left, not the case's own
    gate_deadline_seconds: int
    memory_mb: int
    output_limit_bytes: int
    reference: str  # names this case's incident in the worker log, if the runner broke
    # The runner's --stop-early mode the worker asked for (None: every invocation must be
    # there); a shorter result is believed only when its invocations decide the verdict so.
    stop_early: str | None = None
    # The runner's --wilson-max-runs (the project's verdict_rule: wilson), None: the
    # platform's rule; the result must then stop where the Wilson rule stops.
    wilson_max_runs: int | None = None


@dataclass(frozen=True)
class Judged:
    """The runner's result, trusted: store it with this verdict."""

    result: CaseResult
    status: CaseStatus  # passed, failed, or error when the runner could not judge the case
    successes: int
    passed: bool | None  # None with status error


@dataclass(frozen=True)
class NotJudged:
    """No result to store: the case ends ``status`` for ``reason``."""

    status: CaseStatus
    reason: str
    # The line for the worker log when the runner itself broke (its stderr tail, redacted).
    log: str | None = None
    # The gate's deadline stopped it: the gate's other cases must not start either.
    ends_gate: bool = False


Outcome = Judged | NotJudged


def untrusted(why: object) -> NotJudged:
    """A result the worker will not believe: the case fails, saying why."""
    return NotJudged(CaseStatus.failed, f"the case's result was not trusted: {why}")


def case_outcome(run: RunResult, facts: CaseFacts, redact: Callable[[str], str] = str) -> Outcome:
    """What to store for a case whose container ended as ``run`` says (see the module).

    ``redact`` is applied to everything of the bundle's that a reason or log line quotes,
    before it is cut, so no cut can leave part of a secret behind.
    """
    if run.timed_out and facts.cut_by_deadline:
        return NotJudged(
            CaseStatus.error,
            f"the gate reached its deadline of {facts.gate_deadline_seconds} s while this case "
            "ran; its container was stopped",
            ends_gate=True,
        )
    if run.timed_out:
        return NotJudged(
            CaseStatus.failed,
            f"the case container ran past its hard deadline of {facts.wall_seconds} s and was "
            "killed",
        )
    if run.oom_killed:
        return NotJudged(
            CaseStatus.failed,
            f"the case container ran out of memory (limit {facts.memory_mb} MB)",
        )
    if run.output_truncated:
        return untrusted(
            f"the container printed more than its output limit ({facts.output_limit_bytes} "
            "bytes), so its result is incomplete"
        )
    if run.exit_code != 0 and result_blocks(run.stdout):
        return untrusted(
            f"the container exited with code {run.exit_code}, so its result block is not the "
            "runner's verdict"
        )
    try:
        result = parse_runner_output(
            run.stdout, nonce=facts.nonce, suite=facts.suite, test_name=facts.test_name
        )
        if result.case_error:
            return Judged(result, CaseStatus.error, 0, None)
        successes, passed = trusted_verdict(
            result,
            runs=facts.runs,
            success_threshold=facts.success_threshold,
            stop_early=facts.stop_early,
            wilson_max_runs=facts.wilson_max_runs,
        )
    except UntrustedResult as exc:
        return untrusted(redact(str(exc)))
    except RunnerOutputError as exc:
        return _runner_broke(run, facts, redact(str(exc)), redact)
    return Judged(result, CaseStatus.passed if passed else CaseStatus.failed, successes, passed)


def _runner_broke(
    run: RunResult, facts: CaseFacts, why: str, redact: Callable[[str], str]
) -> NotJudged:
    """The runner printed no result: our fault, not the bundle's. The reason gives a summary
    and a reference; the stderr tail goes to the worker log under that reference."""
    stderr = redact(run.stderr.decode("utf-8", "replace").replace("\x00", ""))
    tail = stderr[-STDERR_TAIL_CHARS:].strip() or "(empty)"
    return NotJudged(
        CaseStatus.error,
        f"the runner failed (exit code {run.exit_code}): " + incidents.public(why, facts.reference),
        log=f"the runner failed (exit code {run.exit_code}, reference {facts.reference}): "
        f"{why}; stderr: {tail}",
    )

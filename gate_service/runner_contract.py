"""What the worker believes of a case container's output: the trust checks and the parsing.

The result's shape is the runner's own, defined once in ``gate_runner.contract`` (schema
v2): the document is validated against those same dataclasses with pydantic, which refuses
a field they do not declare and a value not of its field's type. What is checked here on
top: exactly one result block between the markers, the worker's nonce, the suite and case it
was started for, and the verdict recomputed from the suite the worker validated.

May import ``gate_runner.contract`` and ``gate_runner.verdict`` (plain code the runner
shares), never the worker, the database or the sandbox.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Final

from pydantic import TypeAdapter

from gate_runner import contract
from gate_runner.contract import SCHEMA_VERSION, CaseResult
from gate_runner.sequential import wilson_applies, wilson_final, wilson_stop_ok
from gate_runner.verdict import case_passes, verdict_decided

# The runner's markers as the lines of its stdout, which is read as bytes.
BEGIN_MARKER: Final = contract.BEGIN_MARKER.encode()
END_MARKER: Final = contract.END_MARKER.encode()

# Built once per process: pydantic compiles the dataclasses' validator here.
_CASE_RESULT: Final = TypeAdapter(CaseResult)


def without_nul(value: Any) -> Any:
    """Postgres text and JSONB cannot hold NUL; user output can. Replace it visibly."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    return value


def validate_result(data: Any) -> CaseResult:
    """Decoded JSON as the runner's result: every field of the contract there, each of its
    type, no other (pydantic's ValidationError, a ValueError, otherwise).

    Lax mode, pydantic's default, as the service always read results: JSON's 1.0 or "1"
    is read as the int 1, say; "soon" for an int or a list for a dict is refused.
    """
    return _CASE_RESULT.validate_python(without_nul(data))


class RunnerOutputError(Exception):
    """The container's stdout held no result document: the runner itself broke."""


class UntrustedResult(RunnerOutputError):
    """The output held a result the worker will not believe (forged, doubled, foreign)."""


def parse_runner_output(
    stdout: bytes,
    *,
    nonce: str | None = None,
    suite: str | None = None,
    test_name: str | None = None,
) -> CaseResult:
    """The one result block of the runner, checked against what the worker handed in.

    Exactly one block must be there: the runner writes one, and anything else on its stdout
    did not come from it. With ``nonce`` the block must carry it; with ``suite`` and
    ``test_name`` it must be the result of that case.
    """
    lines = [line.rstrip(b"\r") for line in stdout.split(b"\n")]
    begins = [i for i, line in enumerate(lines) if line == BEGIN_MARKER]
    ends = [i for i, line in enumerate(lines) if line == END_MARKER]
    if not begins and not ends:
        raise RunnerOutputError("the runner printed no result (no result markers in its output)")
    if len(begins) != 1 or len(ends) != 1:
        raise UntrustedResult(
            f"the output held {len(begins)} result start and {len(ends)} result end marker "
            "line(s), not one result"
        )
    if ends[0] != begins[0] + 2:
        raise UntrustedResult("the result block is not one line between its markers")
    body = lines[begins[0] + 1]
    try:
        result = validate_result(json.loads(body))
    except (ValueError, RecursionError) as exc:
        raise RunnerOutputError(
            f"the runner's result does not match contract v{SCHEMA_VERSION}: {exc}"
        ) from None
    if nonce is not None and not hmac.compare_digest((result.nonce or "").encode(), nonce.encode()):
        raise UntrustedResult("the result does not carry the nonce handed to this container")
    if (suite is not None and result.suite != suite) or (
        test_name is not None and result.test_name != test_name
    ):
        raise UntrustedResult(
            f"the result is for {result.suite}::{result.test_name}, not {suite}::{test_name}"
        )
    return result


def result_blocks(stdout: bytes) -> int:
    """How many result start markers stand on a line of their own.

    The runner prints its result as one line of JSON, in which a newline can only appear
    escaped, so a marker inside a string of the result never starts a line.
    """
    return sum(1 for line in stdout.split(b"\n") if line.rstrip(b"\r") == BEGIN_MARKER)


def trusted_verdict(
    result: CaseResult,
    *,
    runs: int,
    success_threshold: int,
    stop_early: str | None = None,
    wilson_max_runs: int | None = None,
) -> tuple[int, bool]:
    """(successes, passed) from the validated suite's runs and threshold, not the runner's.

    The runner's own `runs`, `success_threshold`, `successes` and `passed` are not taken:
    there must be one invocation for each run, and the verdict is recomputed here, always
    against the suite's full `runs`. With ``stop_early`` (the mode the worker asked the
    runner for) the result may hold only the first invocations, and only when those already
    decide the verdict by that mode (``verdict_decided``, counting every failure as the
    agent's): a short result that decides nothing is not the runner's early stop.
    """
    indices = sorted(inv.index for inv in result.invocations)
    successes = sum(1 for inv in result.invocations if inv.passed)
    if wilson_max_runs is not None and wilson_applies(runs, success_threshold):
        return _wilson_verdict(result, indices, runs, success_threshold, wilson_max_runs)
    if indices == list(range(runs)):
        return successes, case_passes(successes, runs, success_threshold)
    short = 0 < len(indices) < runs and indices == list(range(len(indices)))
    if (
        stop_early is None
        or not short
        or not verdict_decided(
            stop_early,
            runs=runs,
            success_threshold=success_threshold,
            successes=successes,
            agent_failures=len(indices) - successes,
        )
    ):
        early = ""
        if stop_early is not None and short:
            early = f", which do not decide its verdict (early stop: {stop_early})"
        raise UntrustedResult(
            f"the result holds invocations {indices}{early}, but the suite asks for {runs} run(s)"
        )
    return successes, case_passes(successes, runs, success_threshold)


def _wilson_verdict(
    result: CaseResult, indices: list[int], runs: int, success_threshold: int, max_runs: int
) -> tuple[int, bool]:
    """``trusted_verdict`` under the Wilson rule: the invocations are 0..m-1, and m is where
    the rule stops on their passes in index order (gate_runner/sequential.py); the verdict is
    the rule's there. Anything else was not the runner's stopping point."""
    ran = len(indices)
    passes = [inv.passed for inv in sorted(result.invocations, key=lambda inv: inv.index)]
    if indices != list(range(ran)) or not wilson_stop_ok(passes, runs, success_threshold, max_runs):
        raise UntrustedResult(
            f"the result holds invocations {indices[:50]}, which is not where the Wilson rule "
            f"stops for {runs} run(s) at {success_threshold}% (at most {max(max_runs, runs)})"
        )
    successes = sum(passes)
    return successes, wilson_final(successes, ran, success_threshold)

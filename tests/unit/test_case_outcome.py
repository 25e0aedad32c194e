"""worker/outcome.py: one branch of case_outcome per test, from the container's facts alone."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gate_runner.contract import BEGIN_MARKER, END_MARKER
from gate_service.models import CaseStatus
from gate_service.sandbox import RunResult
from gate_service.worker.outcome import CaseFacts, Judged, NotJudged, case_outcome

NONCE = "n" * 64
FACTS = CaseFacts(
    suite="tests/calc.yaml",
    test_name="adds",
    nonce=NONCE,
    runs=2,
    success_threshold=100,
    wall_seconds=130,
    cut_by_deadline=False,
    gate_deadline_seconds=3600,
    memory_mb=512,
    output_limit_bytes=1000,
    reference="0123456789ab",
)


def invocation(index: int, passed: bool) -> dict[str, Any]:
    return {
        "index": index,
        "status": "completed",
        "passed": passed,
        "input": {},
        "output": {"sum": 5},
        "error": None,
        "failure_reason": None if passed else "output.sum == 4",
        "failed_assertions": [] if passed else ["output.sum == 4"],
        "run_context": {},
        "duration_ms": 3,
        "traces": [],
    }


def document(**changes: Any) -> dict[str, Any]:
    doc = {
        "schema_version": 2,
        "suite": FACTS.suite,
        "test_name": FACTS.test_name,
        "agent_name": "calc",
        "runs": 2,
        "success_threshold": 100,
        "successes": 2,
        "passed": True,
        "case_error": None,
        "failure_reason": None,
        "duration_ms": 9,
        "invocations": [invocation(0, True), invocation(1, True)],
        "nonce": NONCE,
    }
    doc.update(changes)
    return doc


def run(stdout: bytes = b"", **changes: Any) -> RunResult:
    base = RunResult(
        exit_code=0,
        stdout=stdout,
        stderr=b"",
        duration_ms=40,
        timed_out=False,
        oom_killed=False,
        output_truncated=False,
    )
    return dataclasses.replace(base, **changes)


def printed(doc: dict[str, Any], before: bytes = b"") -> bytes:
    return before + f"{BEGIN_MARKER}\n{json.dumps(doc)}\n{END_MARKER}\n".encode()


def not_judged(outcome: object) -> NotJudged:
    assert isinstance(outcome, NotJudged), outcome
    return outcome


def test_a_container_the_gates_deadline_stopped_is_an_error_that_ends_the_gate() -> None:
    outcome = not_judged(
        case_outcome(run(timed_out=True), dataclasses.replace(FACTS, cut_by_deadline=True))
    )
    assert (outcome.status, outcome.ends_gate) == (CaseStatus.error, True)
    assert outcome.reason == (
        "the gate reached its deadline of 3600 s while this case ran; its container was stopped"
    )


def test_a_container_past_its_own_deadline_fails() -> None:
    outcome = not_judged(case_outcome(run(printed(document()), timed_out=True), FACTS))
    assert (outcome.status, outcome.ends_gate) == (CaseStatus.failed, False)
    assert outcome.reason == "the case container ran past its hard deadline of 130 s and was killed"


def test_a_container_out_of_memory_fails() -> None:
    outcome = not_judged(case_outcome(run(printed(document()), oom_killed=True), FACTS))
    assert outcome.status == CaseStatus.failed
    assert outcome.reason == "the case container ran out of memory (limit 512 MB)"


def test_a_cut_output_is_not_trusted() -> None:
    outcome = not_judged(case_outcome(run(printed(document()), output_truncated=True), FACTS))
    assert outcome.status == CaseStatus.failed
    assert outcome.reason == (
        "the case's result was not trusted: the container printed more than its output limit "
        "(1000 bytes), so its result is incomplete"
    )


def test_a_block_from_a_container_that_did_not_exit_0_is_not_trusted() -> None:
    outcome = not_judged(case_outcome(run(printed(document()), exit_code=1), FACTS))
    assert outcome.status == CaseStatus.failed
    assert "exited with code 1, so its result block is not the runner's verdict" in outcome.reason


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        (printed(document(nonce="x" * 64)), "does not carry the nonce handed to this container"),
        (printed(document(), before=printed(document())), "2 result start and 2 result end"),
        (printed(document(test_name="other")), "is for tests/calc.yaml::other, not"),
        (printed(document(invocations=[invocation(0, True)])), "holds invocations [0], but"),
    ],
    ids=["foreign nonce", "two blocks", "another case", "too few invocations"],
)
def test_a_forged_or_foreign_result_is_not_trusted(stdout: bytes, why: str) -> None:
    outcome = not_judged(case_outcome(run(stdout), FACTS))
    assert outcome.status == CaseStatus.failed
    assert outcome.reason.startswith("the case's result was not trusted: ")
    assert why in outcome.reason


def test_a_runner_that_printed_no_result_is_an_error_with_a_reference() -> None:
    broken = run(b"no markers here", exit_code=70, stderr=b"Traceback: sk-secret-value")
    outcome = not_judged(
        case_outcome(broken, FACTS, lambda text: text.replace("sk-secret-value", "[REDACTED:K]"))
    )
    assert outcome.status == CaseStatus.error
    assert outcome.reason.startswith("the runner failed (exit code 70): ")
    assert "0123456789ab" in outcome.reason and "Traceback" not in outcome.reason
    # The stderr tail is for the worker log, redacted, under the same reference.
    assert outcome.log is not None and "reference 0123456789ab" in outcome.log
    assert "[REDACTED:K]" in outcome.log and "sk-secret-value" not in outcome.log


def test_a_result_the_runner_could_not_judge_is_an_error() -> None:
    doc = document(case_error="agent 'calc' does not exist", invocations=[], successes=0)
    outcome = case_outcome(run(printed(doc)), FACTS)
    assert isinstance(outcome, Judged)
    assert (outcome.status, outcome.passed, outcome.successes) == (CaseStatus.error, None, 0)


def test_the_verdict_is_recomputed_from_the_validated_suite_not_the_result() -> None:
    # The result claims a pass; one invocation failed and the threshold is 100%.
    doc = document(invocations=[invocation(0, True), invocation(1, False)], passed=True)
    outcome = case_outcome(run(printed(doc)), FACTS)
    assert isinstance(outcome, Judged)
    assert (outcome.status, outcome.passed, outcome.successes) == (CaseStatus.failed, False, 1)
    lenient = case_outcome(run(printed(doc)), dataclasses.replace(FACTS, success_threshold=50))
    assert isinstance(lenient, Judged)
    assert (lenient.status, lenient.passed) == (CaseStatus.passed, True)


def test_a_trusted_passing_result_passes() -> None:
    outcome = case_outcome(run(printed(document(), before=b"user output\n")), FACTS)
    assert isinstance(outcome, Judged)
    assert (outcome.status, outcome.passed, outcome.successes) == (CaseStatus.passed, True, 2)
    assert outcome.result.nonce == NONCE

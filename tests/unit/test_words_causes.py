"""client/words.py and client/causes.py: the one word of each outcome, costs, durations and
cut texts; and the cause of a case's failure, read from the texts the runner and the worker
really write (made here by their own functions, so a change of their wording breaks a test
here rather than a group on the page)."""

from __future__ import annotations

import threading
from dataclasses import replace
from functools import cache
from types import SimpleNamespace
from typing import Any

import pytest

from gate_runner.assertions import compile_assertions
from gate_runner.case import (
    PreparedCase,
    _agent_data,
    _setup_failure,
    judge_invocation,
    judge_settled,
)
from gate_runner.invocations import Supervisor
from gate_runner.mocks import StrictViolation
from gate_runner.runtime.mocking import resolve_phase
from gate_runner.runtime.orchestrator import Runtime, RunTimedOut
from gate_runner.runtime.output_schema import final_output
from gate_runner.runtime.trace import error_text
from gate_runner.runtime_errors import AgentRunError
from gate_runner.verdict import case_failure_reason, unjudged_reason
from gate_service.client.causes import (
    CAUSES,
    Cause,
    case_cause,
    check_cause,
    failure_groups,
    first_check,
)
from gate_service.client.shapes import CaseView
from gate_service.client.words import (
    MARKS,
    Outcome,
    case_marks,
    case_outcome,
    cut,
    duration,
    money,
    span_outcome,
    span_word,
)
from gate_service.worker.outcome import NotJudged
from gate_service.worker.outcome import case_outcome as worker_outcome
from tests.unit.test_case_outcome import FACTS, run

# -- words ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usd", "shown"),
    [
        (0.0012799999999999999, "$0.001280"),  # a float's noise is not a figure
        (12.345, "$12.35"),
        (0, "$0.00"),
        (0.0, "$0.00"),
        (0.0123, "$0.01230"),
        (0.1, "$0.1000"),
        (1, "$1.000"),
        (0.99996, "$1.000"),  # rounded first: four figures of 1, not five nines
        (0.009999, "$0.009999"),
        (0.0000123456, "$0.00001235"),
        (99.994, "$99.99"),
        (99.996, "$100.00"),
        (123.45, "$123.45"),  # from $100 on, to the cent, and no cent made up
        (1234.5, "$1,234.50"),
        (9999.5, "$9,999.50"),
        (123456789, "$123,456,789.00"),
        (None, "—"),
        (float("nan"), "—"),
        (float("inf"), "—"),
        (True, "—"),  # a bool is no cost
    ],
)
def test_money_has_its_currency_and_four_significant_figures(usd: Any, shown: str) -> None:
    assert money(usd) == shown


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (0, "0 ms"),
        (850, "850 ms"),
        (999, "999 ms"),
        (999.9, "999 ms"),
        (1000, "1.0 s"),
        (1200, "1.2 s"),
        (1249, "1.2 s"),
        (59_949, "59.9 s"),
        (59_950, "1 min 0 s"),  # never "60.0 s"
        (59_999, "1 min 0 s"),
        (60_000, "1 min 0 s"),
        (125_000, "2 min 5 s"),
        (3_599_000, "59 min 59 s"),
        (3_599_600, "1 h 0 min"),
        (3_600_000, "1 h 0 min"),
        (3_780_000, "1 h 3 min"),
        (-5, "0 ms"),
        (None, "—"),
        (False, "—"),
    ],
)
def test_duration_is_in_human_units(ms: Any, shown: str) -> None:
    assert duration(ms) == shown


def test_a_cut_text_says_exactly_how_much_was_cut() -> None:
    assert cut("abcdef", 6) == "abcdef"
    assert cut("abcdef", 3) == "abc…[3 more characters]"
    assert cut("x" * 2000, 10) == "x" * 10 + "…[1,990 more characters]"
    assert cut("", 3) == "" and cut(None, 3) == ""
    kept, said = cut("é" * 801, 800).split("…")
    assert kept == "é" * 800 and said == "[1 more character]"


def view(**fields: Any) -> CaseView:
    base: dict[str, Any] = {"agent_name": "calc", "test_name": "t", "runs": 2}
    return CaseView.of(base | fields)


QUARANTINE = {"owner": "ana", "reason": "upstream", "expires_at": "2027-01-31T00:00:00Z"}
FLAKY = {"gates": 6, "passed_gates": 3, "successes": 4, "runs": 6, "low": 1.0, "high": 2.0}


@pytest.mark.parametrize(
    ("fields", "outcome", "marks"),
    [
        ({"status": "passed", "passed": True}, Outcome.passed, []),
        ({"status": "failed", "passed": False}, Outcome.failed, []),
        ({"status": "failed", "passed": None}, Outcome.failed, []),
        # Regressed against its baseline: it fails the gate, though its threshold held.
        (
            {"status": "passed", "passed": True, "regression_level": "regression"},
            Outcome.failed,
            ["REGRESSED"],
        ),
        ({"status": "passed", "passed": True, "regression_level": "likely"}, Outcome.passed, []),
        # Reported, and none of these fails the gate.
        (
            {"status": "failed", "passed": False, "quarantine": QUARANTINE},
            Outcome.skipped,
            ["QUARANTINED"],
        ),
        (
            {"status": "passed", "passed": True, "quarantine": QUARANTINE},
            Outcome.passed,
            ["QUARANTINED"],
        ),
        ({"status": "passed", "passed": True, "reused_from": "c0"}, Outcome.skipped, ["REUSED"]),
        ({"status": "cancelled", "passed": None}, Outcome.skipped, ["CANCELLED"]),
        ({"status": "error", "passed": None}, Outcome.error, []),
        ({"status": "running"}, Outcome.pending, []),
        ({"status": "queued"}, Outcome.pending, []),
        ({}, Outcome.pending, []),
        ({"status": "passed", "passed": True, "flaky": FLAKY}, Outcome.passed, ["FLAKY"]),
        (
            {
                "status": "passed",
                "passed": True,
                "regression_level": "regression",
                "quarantine": QUARANTINE,
                "flaky": FLAKY,
            },
            Outcome.skipped,
            ["QUARANTINED", "REGRESSED", "FLAKY"],
        ),
    ],
)
def test_a_cases_outcome_and_its_marks(
    fields: dict[str, Any], outcome: Outcome, marks: list[str]
) -> None:
    case = view(**fields)
    assert case_outcome(case) is outcome
    assert case_marks(case) == marks


@pytest.mark.parametrize(
    ("status", "outcome", "word"),
    [
        ("ok", Outcome.passed, "PASSED"),
        ("passed", Outcome.passed, "PASSED"),
        ("completed", Outcome.passed, "PASSED"),
        ("error", Outcome.failed, "FAILED"),
        ("failed", Outcome.failed, "FAILED"),
        ("timeout", Outcome.failed, "FAILED"),
        ("skipped", Outcome.skipped, "SKIPPED"),
        ("warned", Outcome.warned, "WARNED"),
        ("blocked", Outcome.blocked, "BLOCKED"),
        ("paused", Outcome.other, "PAUSED"),  # one not known here: shown as it is
        (None, Outcome.other, "NONE"),
    ],
)
def test_a_steps_status_has_one_word(status: object, outcome: Outcome, word: str) -> None:
    assert span_outcome(status) is outcome
    assert span_word(status) == word


def test_every_outcome_has_its_mark_and_only_a_pass_is_green() -> None:
    assert set(MARKS) == set(Outcome)
    symbols = {outcome: symbol for outcome, (symbol, _) in MARKS.items()}
    assert symbols[Outcome.passed] == "✓"
    assert symbols[Outcome.failed] == symbols[Outcome.error] == "✗"
    assert symbols[Outcome.skipped] == "○"
    assert symbols[Outcome.warned] == "!"
    assert symbols[Outcome.blocked] == "⊘"
    # Green is a step that went well: a pass, or a guardrail that masked part of the text.
    assert [o for o, (_, colour) in MARKS.items() if "green" in colour] == [
        Outcome.passed,
        Outcome.redacted,
    ]
    assert Outcome.skipped.word == "SKIPPED" and Outcome.error.word == "ERROR"


# -- causes: texts from the runner's and the worker's own functions ------------------------


def prepared(**assertions: Any) -> PreparedCase:
    return PreparedCase(
        suite="tests/calc.yaml",
        agent_name="calc",
        resolved={"timeout_s": 5},
        assertions=compile_assertions(assertions),
        payload={},
    )


def invocation_reason(case: PreparedCase, **data: Any) -> str:
    """An invocation's failure_reason as the runner writes it (case._judged)."""
    data = {"output": None, "error": None, "traces": []} | data
    failures = judge_invocation(case, data)
    assert failures, data
    return "; ".join(failures)


def failed_case(*reasons: str | None, name: str = "t", **fields: Any) -> CaseView:
    """A failed case whose reason is the runner's case sentence over ``reasons``."""
    sentence = case_failure_reason(
        runs=len(reasons), success_threshold=100, invocation_reasons=list(reasons)
    )
    assert sentence is not None
    return view(test_name=name, status="failed", passed=False, failure_reason=sentence, **fields)


def schema_error() -> str:
    """What an LLM agent's run says when its answer does not fit its output_schema."""
    schema = {"type": "object", "required": ["total"], "properties": {"total": {}}}
    agent = SimpleNamespace(
        config=SimpleNamespace(output_schema="report", output_schema_dict=schema)
    )
    with pytest.raises(AgentRunError) as raised:
        final_output(agent, '{"sum": 1}')
    return error_text(raised.value)


def child_timeout_error() -> str:
    """A triggered child's (or a chain stage's) own timeout, as the orchestrator says it."""
    release = threading.Event()
    try:
        with pytest.raises(RunTimedOut) as raised:
            Runtime({})._within(0.01, "slowpoke", release.wait)  # type: ignore[arg-type]
    finally:
        release.set()
    return error_text(raised.value)


def timeout_s_error() -> str:
    """The runner's stop at timeout_s, as case.py says it when the invocation was killed."""
    limits = SimpleNamespace(resolved={"timeout_s": 5}, agent_config=None)
    proc = SimpleNamespace(timed_out=True, report_overflow=False)
    error = _agent_data(limits, proc, {})["error"]  # type: ignore[arg-type]
    assert error == "timed out after 5 s (timeout_s)"
    return str(error)


def strict_violation() -> str:
    rt = SimpleNamespace(
        violations=[],
        mocks=SimpleNamespace(hook=lambda key, phase: None, strict=SimpleNamespace(hooks=True)),
    )
    with pytest.raises(StrictViolation):
        resolve_phase(rt, "hook", lambda: None, "calc", "before")  # type: ignore[arg-type]
    (violation,) = rt.violations
    return str(violation)


def runner_could_not_judge() -> str:
    """judge_settled's own failure: a report that fits and still breaks judging. The
    exception's text says " raised ", as any may: it is still the runner's failure."""
    odd = {"status": "completed", "output": None, "error": None, "duration_ms": 1}
    odd["traces"] = [{"span_id": "a", "the tool raised it": 1}]
    reason = judge_settled(prepared(), 0, odd).invocation.failure_reason
    assert reason is not None and reason.startswith("the runner could not judge")
    return reason


@cache
def agents_reasons() -> list[tuple[str, Cause]]:
    """(invocation reason, its cause) for each cause of the agent's behaviour."""
    p = prepared
    return [
        (
            invocation_reason(
                p(expected_result="output.total == 42"),
                status="completed",
                output={"total": 41},
            ),
            Cause.result,
        ),
        # `status == "completed"` against a crash: the crash is the cause.
        (
            invocation_reason(
                p(expected_result='status == "completed"'), status="failed", error="ValueError: x"
            ),
            Cause.run_error,
        ),
        (
            invocation_reason(
                p(expected_result='status == "completed"'), status="failed", error=schema_error()
            ),
            Cause.schema,
        ),
        (invocation_reason(p(), status="failed", error="KeyError: 'sum'"), Cause.run_error),
        (invocation_reason(p(), status="failed", error=schema_error()), Cause.schema),
        (invocation_reason(p(), status="failed", error=timeout_s_error()), Cause.timeout),
        (invocation_reason(p(), status="failed", error=child_timeout_error()), Cause.timeout),
        (
            invocation_reason(
                p(expected_result="output.ok"), status="blocked", output="it held PII"
            ),
            Cause.status,
        ),
        (invocation_reason(p(), status="awaiting_approval"), Cause.status),
        (invocation_reason(p(expected_tool_calls=["refund"]), status="completed"), Cause.tool),
        (
            invocation_reason(
                p(expected_no_tool_calls=["email.send"]),
                status="completed",
                traces=[
                    {
                        "span_id": "s",
                        "type": "tool_call",
                        "name": "send",
                        "status": "ok",
                        "metadata": {"tool_name": "send", "tool_ref": "email.send", "params": {}},
                    }
                ],
            ),
            Cause.tool,
        ),
        (
            invocation_reason(p(expected_tool_call_order=["a", "b"]), status="completed"),
            Cause.tool,
        ),
        (
            invocation_reason(p(expected_child_agents={"helper": {}}), status="completed"),
            Cause.child,
        ),
        (
            invocation_reason(
                p(), status="failed", error=strict_violation(), violations=[strict_violation()]
            ),
            Cause.strict,
        ),
        (
            invocation_reason(
                p(),
                status="completed",
                limit_failures=Supervisor.limit_failures(
                    SimpleNamespace(  # type: ignore[arg-type]
                        isolation=SimpleNamespace(output_limit_bytes=1000, scratch_dir=None)
                    ),
                    SimpleNamespace(output_dropped=True),  # type: ignore[arg-type]
                ),
            ),
            Cause.limit,
        ),
    ]


def setup_reasons() -> list[str]:
    """The test's own setup broke: each stage case.py names."""
    return [
        invocation_reason(prepared(expected_result="output.ok"), **_setup_failure(stage, exc))
        for stage, exc in [
            ("loading the project", ImportError("no module named shop")),
            ("the mocks module 'mocks.py'", ValueError("bad mock")),
            ("builder 'orders' build()", KeyError("id")),
            ("the runner", RuntimeError("stuck")),
        ]
    ]


def test_the_runners_texts_each_name_their_cause() -> None:
    for reason, cause in agents_reasons():
        assert check_cause(reason) is cause, reason
        case = failed_case(None, reason, "another failure after the first")
        assert first_check(case.failure_reason or "") == reason
        assert case_cause(case) is cause, reason
        assert CAUSES[cause].agents
    for reason in setup_reasons():
        assert case_cause(failed_case(reason)) is Cause.setup, reason
    assert not CAUSES[Cause.setup].agents
    assert case_cause(failed_case(runner_could_not_judge())) is Cause.not_judged


def test_the_crash_of_a_status_check_is_read_after_the_seen_values() -> None:
    reason = invocation_reason(
        prepared(expected_result='status == "completed"'), status="failed", error=schema_error()
    )
    assert reason.startswith('expected_result `status == "completed"` was false (seen: ')
    assert "; agent error: output_schema 'report': " in reason
    assert check_cause(reason) is Cause.schema


def test_an_early_stopped_case_sentence_is_read_too() -> None:
    reason = invocation_reason(prepared(expected_tool_calls=["refund"]), status="completed")
    sentence = case_failure_reason(runs=5, success_threshold=100, invocation_reasons=[reason])
    assert sentence is not None and "did not start" in sentence
    assert first_check(sentence) == reason
    case = view(status="failed", passed=False, failure_reason=sentence)
    assert case_cause(case) is Cause.tool


def test_a_reason_without_the_case_sentence_is_its_own_first_check() -> None:
    assert first_check("expected a call to x; it was never called") == (
        "expected a call to x; it was never called"
    )
    assert first_check("first failure (invocation 1 without its colon") == (
        "first failure (invocation 1 without its colon"
    )
    assert check_cause("something the runner never says") is Cause.other


def test_a_provider_failure_is_not_the_agents() -> None:
    reason = unjudged_reason(
        runs=2,
        success_threshold=100,
        successes=1,
        provider_failures=[(1, "model call failed: the provider answered 401")],
    )
    assert reason is not None
    case = view(status="error", passed=None, failure_reason=reason)
    assert case_cause(case) is Cause.provider
    assert not CAUSES[Cause.provider].agents


def worker_case(**container: Any) -> CaseView:
    """A case as the worker stores it when the container left no result to read."""
    outcome = worker_outcome(run(**container), FACTS)
    assert isinstance(outcome, NotJudged)
    passed = False if outcome.status == "failed" else None
    return view(status=outcome.status.value, passed=passed, failure_reason=outcome.reason)


def test_the_workers_own_reasons_each_name_their_cause() -> None:
    assert case_cause(worker_case(timed_out=True)) is Cause.timeout
    assert case_cause(worker_case(oom_killed=True)) is Cause.limit
    # A result the worker will not believe is the bundle's doing (it failed, judged so); a
    # runner that broke left the case unjudged: not the agent's.
    assert case_cause(worker_case(output_truncated=True)) is Cause.untrusted
    assert CAUSES[Cause.untrusted].agents
    assert case_cause(worker_case(exit_code=1)) is Cause.not_judged
    assert not CAUSES[Cause.not_judged].agents
    # The gate's deadline stopped the case: an error, and it timed out.
    deadline = worker_outcome(run(timed_out=True), replace(FACTS, cut_by_deadline=True))
    assert isinstance(deadline, NotJudged) and deadline.status == "error"
    stopped = view(status="error", passed=None, failure_reason=deadline.reason)
    assert case_cause(stopped) is Cause.not_judged  # the gate ended it, not the agent


def test_a_regression_a_quarantined_failure_and_the_rest() -> None:
    regressed = view(status="passed", passed=True, regression_level="regression")
    assert case_cause(regressed) is Cause.regression
    likely = view(status="passed", passed=True, regression_level="likely")
    assert case_cause(likely) is None
    result = agents_reasons()[0][0]
    # A quarantined failure is grouped by its cause, like any other failure.
    parked = failed_case(result, quarantine=QUARANTINE)
    assert case_cause(parked) is Cause.result and case_outcome(parked) is Outcome.skipped
    # A regressed case that also failed: its failure's cause.
    both = failed_case(result, regression_level="regression")
    assert case_cause(both) is Cause.result
    assert case_cause(view(status="passed", passed=True)) is None
    assert case_cause(failed_case(result, reused_from="c0")) is None  # not run
    assert case_cause(view(status="running")) is None
    assert case_cause(view(status="cancelled", failure_reason="the gate was cancelled")) is None
    assert case_cause(view(status="error", failure_reason=None)) is Cause.not_judged


def test_every_cause_has_its_heading() -> None:
    assert set(CAUSES) == set(Cause)
    assert [c for c, info in CAUSES.items() if not info.agents] == [
        Cause.setup,
        Cause.provider,
        Cause.not_judged,
    ]


# -- groups --------------------------------------------------------------------------------


def first_reasons() -> dict[Cause, str]:
    """The first of ``agents_reasons`` of each cause."""
    return {cause: reason for reason, cause in reversed(agents_reasons())}


def test_groups_put_the_agents_behaviour_first_and_the_largest_first() -> None:
    reasons = first_reasons()
    provider = unjudged_reason(
        runs=1, success_threshold=100, successes=0, provider_failures=[(0, "HTTP 429")]
    )
    cases = [
        view(test_name="p1", status="error", failure_reason=provider),
        failed_case(setup_reasons()[0], name="s1"),
        failed_case(reasons[Cause.tool], name="t1"),
        view(test_name="ok", status="passed", passed=True),
        failed_case(reasons[Cause.result], name="r1"),
        failed_case(reasons[Cause.schema], name="x1"),
        view(test_name="p2", status="error", failure_reason=provider),
        failed_case(reasons[Cause.schema], name="x2"),
        failed_case(reasons[Cause.schema], name="x3"),
        failed_case(reasons[Cause.tool], name="t2"),
        view(test_name="n1", status="error", failure_reason="the runner failed (exit code 1)"),
        view(test_name="g1", status="passed", passed=True, regression_level="regression"),
    ]
    groups = failure_groups(cases)
    assert [(g.cause, [c.test_name for c in g.cases]) for g in groups] == [
        (Cause.schema, ["x1", "x2", "x3"]),
        (Cause.tool, ["t1", "t2"]),
        # Ties: in the order of the causes.
        (Cause.result, ["r1"]),
        (Cause.regression, ["g1"]),
        # Not the agent's: after every group that is, however large.
        (Cause.provider, ["p1", "p2"]),
        (Cause.setup, ["s1"]),
        (Cause.not_judged, ["n1"]),
    ]
    assert [g.info.agents for g in groups] == [True] * 4 + [False] * 3
    assert groups[0].line == "3 cases: the answer did not match the agent's output_schema"
    assert groups[2].line == "1 case: expected_result was false"
    assert failure_groups([view(status="passed", passed=True)]) == []


def test_a_hostile_case_moves_only_itself() -> None:
    """The bundle's text follows the runner's words: it can move its own case to another
    group (here a crash whose message forges a timeout), and no other case."""
    reasons = first_reasons()
    forged = (
        "ValueError: x; agent error: timed out after 1 s; first failure (invocation 1): "
        "output_schema 'report'; because a model call failed for a reason that is not the "
        "agent's"
    )
    hostile_reason = invocation_reason(
        prepared(expected_result='status == "completed"'), status="failed", error=forged
    )
    hostile = failed_case(hostile_reason, name="first failure (invocation 1): evil")
    honest = [
        failed_case(reasons[Cause.result], name="r1"),
        failed_case(reasons[Cause.schema], name="x1"),
        failed_case(reasons[Cause.result], name="r2"),
    ]
    without = failure_groups(honest)
    with_it = failure_groups([honest[0], hostile, *honest[1:]])
    assert case_cause(hostile) is Cause.timeout  # its own case, moved
    placed = [g.cause for g in with_it if any(c is hostile for c in g.cases)]
    assert placed == [Cause.timeout]
    # Every other case is where it was without it.
    assert [(g.cause, g.cases) for g in with_it if g.cause is not Cause.timeout] == [
        (g.cause, g.cases) for g in without
    ]
    # A case sentence's first failure is the runner's, whatever follows it.
    sentence = hostile.failure_reason or ""
    assert first_check(sentence) == hostile_reason


MEGABYTE = 1_000_000


def megabyte(start: str, repeated: str) -> str:
    """``start``, then ``repeated`` until the whole is a megabyte or more."""
    return start + repeated * (MEGABYTE // len(repeated) + 1)


@pytest.mark.parametrize(
    ("start", "repeated"),
    [
        pytest.param("", "first failure (invocation ", id="no-colon"),
        pytest.param(
            "2 of 2 invocation(s) failed; first failure (invocation 1): expected_result `",
            "; agent error: agent ",
            id="agent-errors",
        ),
        pytest.param("agent error: agent ", " timed out after", id="timeouts"),
        pytest.param("agent error: ", "output_schema ", id="schemas"),
        pytest.param("loading the project", " raise", id="raise"),
        pytest.param("the runner could not judge", "(", id="not-judged"),
        pytest.param("expected_result `", "`", id="backticks"),
        pytest.param("", "because a model call failed ", id="provider"),
    ],
)
def test_a_megabyte_of_hostile_reason_is_read_at_once(start: str, repeated: str) -> None:
    reason = megabyte(start, repeated)
    assert len(reason) >= MEGABYTE
    for status, passed in (("failed", False), ("error", None)):
        case = view(status=status, passed=passed, failure_reason=reason)
        assert case_cause(case) in set(Cause)
        assert failure_groups([case] * 3)[0].cases == [case] * 3

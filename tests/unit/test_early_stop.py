"""Early stop (docs/semantics.md, "Early stop"): the rule, a property that it never changes a
verdict, and the runner stopping a real case in-process (forked invocations, no Docker).

The rule's arithmetic is ``gate_runner.verdict.verdict_decided``; the runner feeds it each
invocation as it settles (``gate_runner.case.EarlyStop``) and admits no other once it holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate_runner import gateway_wire as wire
from gate_runner.case import EarlyStop, JudgedInvocation, case_verdict, run_case
from gate_runner.contract import SCHEMA_VERSION, CaseResult, Invocation
from gate_runner.invocations import Isolation
from gate_runner.verdict import STOP_DECIDED, STOP_FAILING, STOP_MODES, verdict_decided
from gate_service.runner_contract import trusted_verdict, validate_result
from tests.fixtures.fake_gateway import FakeGateway
from tests.fixtures.projects import write

# -- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "runs", "threshold", "successes", "agent_failures", "decided"),
    [
        # 10 runs at 70%: 7 needed, so a 4th failure of its own leaves at most 6.
        (STOP_FAILING, 10, 70, 0, 3, False),
        (STOP_FAILING, 10, 70, 0, 4, True),
        (STOP_FAILING, 10, 70, 6, 4, True),
        # At 100% the first failure decides it; at 1% (1 of 10 needed) only the tenth.
        (STOP_FAILING, 10, 100, 0, 1, True),
        (STOP_FAILING, 10, 1, 0, 9, False),
        (STOP_FAILING, 10, 1, 0, 10, True),
        # 2 of 3 at 67% is 66.67%: 3 are needed, so one failure decides it (exact integers).
        (STOP_FAILING, 3, 67, 2, 1, True),
        (STOP_FAILING, 3, 66, 2, 1, False),
        # A met threshold decides the case only in "decided" mode.
        (STOP_FAILING, 10, 30, 3, 0, False),
        (STOP_DECIDED, 10, 30, 3, 0, True),
        (STOP_DECIDED, 10, 30, 2, 0, False),
        (STOP_DECIDED, 10, 70, 0, 4, True),
        # A threshold of 0 needs no success, and still runs one invocation.
        (STOP_DECIDED, 10, 0, 0, 0, False),
        (STOP_DECIDED, 10, 0, 1, 0, True),
        (STOP_DECIDED, 10, 0, 0, 5, False),
    ],
)
def test_the_rule_decides_only_what_the_rest_cannot_change(
    mode: str, runs: int, threshold: int, successes: int, agent_failures: int, decided: bool
) -> None:
    assert (
        verdict_decided(
            mode,
            runs=runs,
            success_threshold=threshold,
            successes=successes,
            agent_failures=agent_failures,
        )
        is decided
    )


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="failing, decided"):
        verdict_decided("soon", runs=2, success_threshold=100, successes=0, agent_failures=2)
    with pytest.raises(ValueError, match="failing, decided"):
        EarlyStop("soon", 2, 100)


def outcome(index: int, kind: str) -> JudgedInvocation:
    """A judged invocation: ``pass``, ``fail`` (the agent's) or ``provider`` (a model call
    that failed outside the agent)."""
    passed = kind == "pass"
    reason = None if passed else f"invocation {index} failed ({kind})"
    invocation = Invocation(
        index=index,
        status="completed" if passed else "failed",
        passed=passed,
        input={},
        output=None,
        error=None if passed else reason,
        failure_reason=reason,
        failed_assertions=[] if reason is None else [reason],
        run_context={},
        duration_ms=1,
        traces=[],
    )
    return JudgedInvocation(
        invocation, "the provider refused the key" if kind == "provider" else None
    )


def test_a_provider_failure_never_stops_a_case() -> None:
    # At 100% of 2, one failure of the agent's decides the case; a provider's does not: had
    # the other run passed, the case would be unjudged, not failed.
    stop = EarlyStop(STOP_FAILING, 2, 100)
    stop.settle(outcome(0, "provider"))
    assert not stop.reached()
    stop.settle(outcome(1, "fail"))
    assert stop.reached()


def test_one_run_or_no_mode_never_stops() -> None:
    for stop in (EarlyStop(STOP_DECIDED, 1, 100), EarlyStop(None, 5, 100)):
        stop.settle(outcome(0, "fail"))
        assert not stop.reached()


def status(verdict: tuple[int, bool, str | None, str | None]) -> str:
    _successes, passed, unjudged, _reason = verdict
    return "error" if unjudged else "passed" if passed else "failed"


def test_a_stopped_failing_case_says_how_many_did_not_start() -> None:
    ran = [outcome(i, "fail") for i in range(4)]
    successes, passed, unjudged, reason = case_verdict(10, 70, ran)
    assert (successes, passed, unjudged) == (0, False, None)
    assert reason is not None
    assert reason.startswith(
        "4 of 10 invocation(s) failed and 6 did not start, since the case could no longer pass "
        "(early stop; 0 passed, 7 needed for 70%); first failure (invocation 1): "
    )


# -- the property: the verdict with early stop is the verdict without --------------------------


@pytest.mark.slow  # 400 generated cases, a second and more: the full suite and CI run it
@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    runs=st.integers(1, 20),
    threshold=st.integers(0, 100),
    mode=st.sampled_from(STOP_MODES),
    parallel=st.integers(1, 4),
)
def test_early_stop_never_changes_the_verdict(
    data: st.DataObject, runs: int, threshold: int, mode: str, parallel: int
) -> None:
    """Any outcomes, runs, threshold and mode; invocations admitted in index order, up to
    ``parallel`` at once, ending in any order (hypothesis picks which of those in flight
    ends next), as the runner's loop admits and settles them."""
    kinds = data.draw(
        st.lists(st.sampled_from(["pass", "fail", "provider"]), min_size=runs, max_size=runs)
    )
    stop = EarlyStop(mode, runs, threshold)
    pending, in_flight = list(range(runs)), []
    while in_flight or (pending and not stop.reached()):
        while len(in_flight) < parallel and pending and not stop.reached():
            in_flight.append(pending.pop(0))
        ended = data.draw(st.sampled_from(in_flight))
        in_flight.remove(ended)
        stop.settle(outcome(ended, kinds[ended]))
    ran = sorted(stop.judged)
    assert ran == list(range(len(ran))), "the invocations run are the first ones"
    short = [stop.judged[i] for i in ran]
    full = [outcome(i, kind) for i, kind in enumerate(kinds)]
    with_stop, without = case_verdict(runs, threshold, short), case_verdict(runs, threshold, full)
    assert status(with_stop) == status(without), (kinds[: len(ran)], kinds)
    if len(ran) < runs:
        # It stopped because the verdict was decided, and the decision is never taken back:
        # every longer prefix decides it too.
        for more in range(len(ran), runs + 1):
            longer = EarlyStop(mode, runs, threshold)
            for judged in full[:more]:
                longer.settle(judged)
            assert longer.reached()
    if with_stop[2] is None:
        # The worker believes the honest short result, and recomputes the same verdict.
        result = CaseResult(
            schema_version=SCHEMA_VERSION,
            suite="tests/s.yaml",
            test_name="c",
            agent_name="a",
            runs=runs,
            success_threshold=threshold,
            successes=with_stop[0],
            passed=with_stop[1],
            case_error=None,
            failure_reason=with_stop[3],
            duration_ms=1,
            invocations=[j.invocation for j in short],
        )
        assert trusted_verdict(result, runs=runs, success_threshold=threshold, stop_early=mode) == (
            with_stop[0],
            without[1],
        )


# -- the runner: a real case in-process --------------------------------------------------------


def probe_project(root: Path, marks: Path) -> Path:
    """Tool agents whose every started invocation leaves a file in ``marks``; one runs an
    invocation at a time, one three at once, one under a coalescing concurrency key."""
    marks.mkdir(parents=True, exist_ok=True)

    def suite(agent: str, ok: bool, runs: int, threshold: int) -> str:
        payload = json.dumps({"marks": str(marks), "ok": ok, "tenant": "t1"})
        return (
            f"agent: {agent}\n"
            "tests:\n"
            f"  - name: case\n"
            f"    payload: '{payload}'\n"
            f"    runs: {runs}\n"
            f"    success_threshold: {threshold}\n"
            f"    expected_result: output.ok == true\n"
        )

    def agent(name: str, extra: str = "") -> str:
        return (
            f'version: "1.0"\nname: {name}\ndescription: Answers as told.\ntype: tool\n'
            f"tool_name: probe.answer\n{extra}"
        )

    return write(
        root,
        {
            "agents/one.yaml": agent("one"),
            "agents/three.yaml": agent("three", "max_concurrent_runs: 3\n"),
            "agents/keyed.yaml": agent(
                "keyed",
                "max_concurrent_runs: 2\nconcurrency: {key: tenant, on_conflict: coalesce}\n",
            ),
            "tools/probe.py": """
                import os
                import time


                def answer(payload: dict) -> dict:
                    open(os.path.join(payload["marks"], str(os.getpid())), "w").close()
                    time.sleep(0.05)
                    return {"ok": payload["ok"]}
            """,
            "tests/failing.yaml": suite("one", False, 10, 70),
            "tests/passing.yaml": suite("one", True, 10, 30),
            "tests/parallel.yaml": suite("three", False, 10, 70),
            "tests/keyed.yaml": suite("keyed", False, 10, 100),
        },
    )


def ran(project: Path, marks: Path, suite: str, stop_early: str | None) -> tuple[CaseResult, int]:
    """The case's result as the worker reads it, and how many invocations started."""
    for mark in marks.iterdir():
        mark.unlink()
    result = run_case(project, suite, "case", Isolation(), stop_early=stop_early)
    return validate_result(json.loads(result.to_json())), len(list(marks.iterdir()))


@pytest.fixture
def probe(tmp_path: Path) -> tuple[Path, Path]:
    marks = tmp_path / "marks"
    return probe_project(tmp_path / "p", marks), marks


@pytest.mark.slow  # seconds of real invocations: the full suite and CI run it
@pytest.mark.parametrize("mode", STOP_MODES)
def test_a_failing_ten_run_case_starts_fewer_invocations_with_the_same_verdict(
    probe: tuple[Path, Path], mode: str
) -> None:
    project, marks = probe
    stopped, started = ran(project, marks, "tests/failing.yaml", mode)
    # 7 of 10 needed: the 4th failure decides it, and nothing else starts.
    assert started == 4
    assert [inv.index for inv in stopped.invocations] == [0, 1, 2, 3]
    full, started_without = ran(project, marks, "tests/failing.yaml", None)
    assert started_without == 10 and len(full.invocations) == 10
    assert (stopped.passed, stopped.case_error) == (full.passed, full.case_error) == (False, None)
    assert (stopped.runs, stopped.successes) == (10, 0)
    assert stopped.failure_reason is not None
    assert stopped.failure_reason.startswith("4 of 10 invocation(s) failed and 6 did not start")


@pytest.mark.slow  # seconds of real invocations: the full suite and CI run it
def test_a_passing_case_runs_every_invocation_unless_its_verdict_may_stop_it(
    probe: tuple[Path, Path],
) -> None:
    project, marks = probe
    # "failing" (a gate with a baseline, say): its rate is needed, all 10 run.
    result, started = ran(project, marks, "tests/passing.yaml", STOP_FAILING)
    assert started == 10 and [i.index for i in result.invocations] == list(range(10))
    assert (result.passed, result.successes) == (True, 10)
    # "decided": 3 of 10 meet 30%, and the rest do not start.
    result, started = ran(project, marks, "tests/passing.yaml", STOP_DECIDED)
    assert started == 3 and [i.index for i in result.invocations] == [0, 1, 2]
    assert (result.passed, result.successes, result.runs, result.failure_reason) == (
        True,
        3,
        10,
        None,
    )


def test_in_parallel_the_first_invocations_run_and_those_in_flight_finish(
    probe: tuple[Path, Path],
) -> None:
    project, marks = probe
    result, started = ran(project, marks, "tests/parallel.yaml", STOP_FAILING)
    indices = [inv.index for inv in result.invocations]
    # Three at a time: the 4th failure decides it, with up to two more in flight then.
    assert 4 <= len(indices) <= 6
    assert indices == list(range(len(indices)))  # admitted in index order: no gap
    assert started == len(indices)  # every invocation started is in the result
    assert (result.passed, result.case_error) == (False, None)


def test_under_a_concurrency_key_the_result_is_still_the_first_invocations(
    probe: tuple[Path, Path],
) -> None:
    project, marks = probe
    # coalesce: while invocation 1 holds the key, 2..9 arrive; each replaces the one waiting,
    # cancelled (a failure), and 10 waits. Those failures decide the case at 100%, so the one
    # left waiting never starts.
    result, started = ran(project, marks, "tests/keyed.yaml", STOP_FAILING)
    assert [inv.index for inv in result.invocations] == list(range(9))
    assert started == 1
    assert [inv.status for inv in result.invocations[1:]] == ["cancelled"] * 8
    full, started_without = ran(project, marks, "tests/keyed.yaml", None)
    assert (len(full.invocations), started_without) == (10, 2)
    assert (result.passed, full.passed) == (False, False)
    assert trusted_verdict(result, runs=10, success_threshold=100, stop_early=STOP_FAILING) == (
        0,
        False,
    )


UNAUTHORIZED = wire.GatewayError(
    kind="provider",
    message="openai answered HTTP 401 to POST /v1/chat/completions: Incorrect API key provided",
    provider_status=401,
)
LIVE: dict[str, str] = {
    "agents/bot.yaml": """
        version: "1.0"
        name: bot
        description: Talks to a provider.
        model: openai/gpt-4o
        system_prompt: Be brief.
        retry_options: {attempts: 1, initial_delay: 0, max_delay: 1}
    """,
    "tests/bot.yaml": """
        tests:
          - name: answers
            payload: hi
            runs: 3
            expected_result: output == "hello from the fake provider"
    """,
}


def test_a_case_whose_runs_fail_at_the_provider_runs_them_all_and_stays_unjudged(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    fake_gateway.script = [UNAUTHORIZED] * 3
    project = write(tmp_path / "p", LIVE)
    result = run_case(
        project,
        "tests/bot.yaml",
        "answers",
        Isolation(gateway=fake_gateway.channel),
        stop_early=STOP_DECIDED,
    )
    # No failure of the agent's: nothing decides the case, so every run happens, and the
    # case is unjudged as without early stop (it would be "failed" had the first stopped it).
    assert len(fake_gateway.requests) == 3 and len(result.invocations) == 3
    assert result.case_error is not None and "could not be judged" in result.case_error

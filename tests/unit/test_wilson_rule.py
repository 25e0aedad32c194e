"""The Wilson verdict rule (runner_image/gate_runner/sequential.py, docs/baselines.md): when
it decides, that its error-rate walk is exact, and that the page's table is what it computes."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from gate_runner.case import run_case
from gate_runner.invocations import Isolation
from gate_runner.sequential import operating, wilson_applies, wilson_decision
from gate_service.baselines.stats import operating_table
from gate_service.runner_contract import UntrustedResult, trusted_verdict
from tests.fixtures.projects import write

DOC = Path(__file__).resolve().parents[2] / "docs" / "baselines.md"


def test_it_never_decides_before_the_cases_own_runs() -> None:
    assert wilson_decision(0, 4, 5, 50, 30) == "more"  # 0 of 4 and one still to run


def test_it_passes_on_the_low_end_and_fails_on_the_high_end() -> None:
    # 10 of 10: 72.2-100%. Clears 70, not 80.
    assert wilson_decision(10, 10, 10, 70, 30) == "pass"
    assert wilson_decision(10, 10, 10, 80, 30) == "more"
    # 2 of 10: 5.7-51.0%. Misses 60, not 50.
    assert wilson_decision(2, 10, 10, 60, 30) == "fail"
    assert wilson_decision(2, 10, 10, 50, 30) == "more"


def test_at_the_cap_the_platforms_rule_decides() -> None:
    # 21 of 30 = 70%: 52.1-83.3% still holds 70; at the cap, 21/30 >= 70% passes.
    assert wilson_decision(21, 30, 10, 70, 30) == "pass"
    assert wilson_decision(20, 30, 10, 70, 30) == "fail"
    assert wilson_decision(20, 29, 10, 70, 30) == "more"


@pytest.mark.parametrize(
    ("runs", "threshold", "applies"),
    [(1, 50, False), (5, 100, False), (5, 0, False), (2, 50, True), (10, 99, True)],
)
def test_it_applies_to_several_runs_and_a_threshold_an_interval_can_clear(
    runs: int, threshold: int, applies: bool
) -> None:
    assert wilson_applies(runs, threshold) is applies


@pytest.mark.parametrize(("rate", "threshold"), [(30, 50), (55, 60), (90, 80), (100, 70)])
def test_the_walk_equals_every_sequence_counted_out(rate: int, threshold: int) -> None:
    """operating() against brute force: every pass/fail sequence of the cap's length, its
    probability, and where the rule stops on it."""
    runs, cap = 3, 9
    p = rate / 100
    passed = expected = 0.0
    for seq in itertools.product((1, 0), repeat=cap):
        weight = 1.0
        for hit in seq:
            weight *= p if hit else 1 - p
        for ran in range(1, cap + 1):
            decision = wilson_decision(sum(seq[:ran]), ran, runs, threshold, cap)
            if decision != "more":
                passed += weight if decision == "pass" else 0
                expected += weight * ran
                break
    got = operating(rate, runs, threshold, cap)
    assert got.pass_probability == pytest.approx(passed, abs=1e-12)
    assert got.expected_runs == pytest.approx(expected, abs=1e-9)


def test_it_passes_a_weaker_agent_less_often_than_the_threshold_rule() -> None:
    from gate_service.baselines.stats import threshold_pass_probability

    for threshold in (50, 70, 80, 90):
        weak = threshold - 10
        assert (
            operating(weak, 10, threshold, 30).pass_probability
            < threshold_pass_probability(weak, 10, threshold) / 2
        )


def test_the_pages_table_is_what_the_rule_computes() -> None:
    assert operating_table() in DOC.read_text()


# The rule in the real runner (in-process) and the worker's check of where it stopped.


def counted_project(root: Path, passing: str, runs: int, threshold: int) -> Path:
    """A tool agent whose k-th call (from 1) passes when ``passing`` (a Python expression in
    k) holds; one suite, one case of ``runs`` at ``threshold``%."""
    return write(
        root,
        {
            "agents/counted.yaml": """
                version: "1.0"
                name: counted
                description: Passes by its call count.
                type: tool
                tool_name: counter.call
            """,
            "tools/counter.py": f"""
                import os


                def call(payload: dict) -> dict:
                    path = {str(root / "calls")!r}
                    k = int(open(path).read()) + 1 if os.path.exists(path) else 1
                    with open(path, "w") as fh:
                        fh.write(str(k))
                    return {{"ok": bool({passing})}}
            """,
            "tests/counted.yaml": f"""
                tests:
                  - name: case
                    payload: '{{}}'
                    runs: {runs}
                    success_threshold: {threshold}
                    expected_result: output.ok == True
            """,
        },
    )


def test_the_runner_runs_on_until_the_interval_clears_the_threshold(tmp_path: Path) -> None:
    # n of n: the low end is 56.6% at 5, 70.1% at 9: a 70% threshold passes at the 9th.
    project = counted_project(tmp_path, "True", runs=5, threshold=70)
    result = run_case(project, "tests/counted.yaml", "case", Isolation(), wilson_max_runs=30)
    assert [inv.index for inv in result.invocations] == list(range(9))
    assert (result.passed, result.successes, result.runs) == (True, 9, 5)
    assert trusted_verdict(result, runs=5, success_threshold=70, wilson_max_runs=30) == (9, True)


def test_the_runner_fails_once_the_interval_is_below_and_says_so(tmp_path: Path) -> None:
    # 0 of 3: high end 56.1%, still holds 50; 0 of 4: 49.0%: fails at the 4th.
    project = counted_project(tmp_path, "False", runs=3, threshold=50)
    result = run_case(project, "tests/counted.yaml", "case", Isolation(), wilson_max_runs=30)
    assert len(result.invocations) == 4 and result.passed is False
    assert result.failure_reason is not None
    assert "verdict rule wilson: its Wilson 95% interval 0.0-49.0% lies below 50%" in (
        result.failure_reason
    )
    assert trusted_verdict(result, runs=3, success_threshold=50, wilson_max_runs=30) == (0, False)


def test_at_the_cap_the_runner_decides_by_the_platforms_rule(tmp_path: Path) -> None:
    # Every other call passes: 50% at a 50% threshold never leaves the interval.
    project = counted_project(tmp_path, "k % 2 == 1", runs=4, threshold=50)
    result = run_case(project, "tests/counted.yaml", "case", Isolation(), wilson_max_runs=8)
    assert (len(result.invocations), result.successes, result.passed) == (8, 4, True)


def test_without_the_rule_the_runner_runs_its_runs(tmp_path: Path) -> None:
    project = counted_project(tmp_path, "True", runs=5, threshold=70)
    result = run_case(project, "tests/counted.yaml", "case", Isolation())
    assert len(result.invocations) == 5 and result.passed is True


def test_the_worker_refuses_a_result_that_stopped_where_the_rule_would_not(
    tmp_path: Path,
) -> None:
    project = counted_project(tmp_path, "True", runs=5, threshold=70)
    honest = run_case(project, "tests/counted.yaml", "case", Isolation(), wilson_max_runs=30)
    # Cut at 5 of 5 (56.6-100% still holds 70%): the rule would have gone on.
    cut = dataclasses.replace(honest, invocations=honest.invocations[:5])
    with pytest.raises(UntrustedResult, match="not where the Wilson rule stops"):
        trusted_verdict(cut, runs=5, success_threshold=70, wilson_max_runs=30)
    # One more than the rule runs: also not the runner's.
    extra = dataclasses.replace(
        honest,
        invocations=[*honest.invocations, dataclasses.replace(honest.invocations[0], index=9)],
    )
    with pytest.raises(UntrustedResult, match="not where the Wilson rule stops"):
        trusted_verdict(extra, runs=5, success_threshold=70, wilson_max_runs=30)
    # The platform's rule (no Wilson asked for) takes none of the nine.
    with pytest.raises(UntrustedResult):
        trusted_verdict(honest, runs=5, success_threshold=70)


def test_the_cap_fits_the_gates_deadline_and_never_undercuts_the_runs() -> None:
    from gate_service.config import Settings
    from gate_service.worker.handler import wilson_cap

    settings = Settings(gate_deadline_seconds=3600, case_deadline_slack_seconds=60)
    assert wilson_cap(settings, 30, 5, 70, 10) == 30  # 30 x 25 s fit in the hour
    # 60 s a run: 125 s an invocation with its cleanup and slack, 28 fit in 3,540 s.
    assert wilson_cap(settings, 30, 5, 70, 60) == 28
    assert wilson_cap(settings, 30, 5, 70, 3000) == 5  # its own runs, at least
    assert wilson_cap(settings, None, 5, 70, 10) is None  # the project's rule: threshold
    assert wilson_cap(settings, 30, 5, 100, 10) is None  # the rule does not judge it

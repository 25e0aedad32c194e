"""worker/outcome.py with early stop: a result with fewer invocations than the suite's runs is
believed only when the worker asked for early stop and those invocations decide the verdict
by the mode it asked for; else it is not trusted, as before (next to test_case_outcome.py,
whose documents these are)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gate_runner.__main__ import main as runner_main
from gate_runner.case import run_case
from gate_runner.contract import framed
from gate_runner.invocations import Isolation
from gate_service.config import Settings
from gate_service.models import CaseStatus
from gate_service.runner_contract import parse_runner_output
from gate_service.worker.handler import early_stop_mode, runner_argv
from gate_service.worker.outcome import Judged, case_outcome
from tests.fixtures.projects import write
from tests.unit.test_case_outcome import (
    FACTS,
    NONCE,
    document,
    invocation,
    not_judged,
    printed,
    run,
)

# 10 runs at 70%: 7 needed, so 4 failures of the agent's decide the case failed, and (in
# "decided" mode) 7 passes decide it passed.
TEN = dataclasses.replace(FACTS, runs=10, success_threshold=70)


def short(passes: list[bool]) -> bytes:
    """A result of the first ``len(passes)`` invocations of the 10, passing as given."""
    return printed(
        document(
            runs=10,
            success_threshold=70,
            successes=sum(passes),
            passed=False,
            invocations=[invocation(i, p) for i, p in enumerate(passes)],
        )
    )


@pytest.mark.parametrize(
    ("mode", "passes", "status", "successes"),
    [
        ("failing", [False] * 4, CaseStatus.failed, 0),
        ("failing", [True, False, True, False, False, False], CaseStatus.failed, 2),
        ("decided", [False] * 4, CaseStatus.failed, 0),
        ("decided", [True] * 7, CaseStatus.passed, 7),
        ("decided", [True, False, True, True, True, True, True, True], CaseStatus.passed, 7),
    ],
)
def test_an_honest_short_result_is_judged_against_the_full_runs(
    mode: str, passes: list[bool], status: CaseStatus, successes: int
) -> None:
    outcome = case_outcome(run(short(passes)), dataclasses.replace(TEN, stop_early=mode))
    assert isinstance(outcome, Judged), outcome
    assert (outcome.status, outcome.successes) == (status, successes)
    assert outcome.passed is (status == CaseStatus.passed)


@pytest.mark.parametrize(
    ("mode", "passes", "why"),
    [
        # No early stop asked for: every run must be there, whatever they say.
        (None, [False] * 4, "the result holds invocations [0, 1, 2, 3], but the suite asks"),
        # 3 failures of 10 at 70% leave 7 possible passes: nothing is decided yet.
        ("failing", [False] * 3, "which do not decide its verdict (early stop: failing)"),
        # 7 passes meet the threshold, but "failing" never stops a passing case (a baseline
        # or an interval needs its full rate): a runner that stops it is not believed.
        ("failing", [True] * 7, "which do not decide its verdict (early stop: failing)"),
        ("decided", [True] * 6, "which do not decide its verdict (early stop: decided)"),
        ("decided", [True] * 6 + [False] * 3, "which do not decide its verdict"),
    ],
)
def test_a_short_result_that_decides_nothing_is_not_trusted(
    mode: str | None, passes: list[bool], why: str
) -> None:
    outcome = not_judged(
        case_outcome(run(short(passes)), dataclasses.replace(TEN, stop_early=mode))
    )
    assert outcome.status == CaseStatus.failed
    assert outcome.reason.startswith("the case's result was not trusted: ")
    assert why in outcome.reason and "the suite asks for 10 run(s)" in outcome.reason


@pytest.mark.parametrize(
    "indices",
    [
        [0, 1, 2, 4],  # a gap: not the first invocations
        [1, 2, 3, 4],  # not from the first
        [0, 0, 1, 2],  # one twice
        [],  # none at all
        list(range(11)),  # more than the runs
    ],
)
def test_a_forged_set_of_invocations_is_not_trusted_even_when_it_would_decide(
    indices: list[int],
) -> None:
    doc = document(runs=10, success_threshold=70, successes=0, passed=False)
    doc["invocations"] = [invocation(i, False) for i in indices]
    facts = dataclasses.replace(TEN, stop_early="decided")
    outcome = not_judged(case_outcome(run(printed(doc)), facts))
    assert "not trusted" in outcome.reason and "the suite asks for 10 run(s)" in outcome.reason


def test_a_full_result_is_trusted_with_or_without_early_stop() -> None:
    for mode in (None, "failing", "decided"):
        outcome = case_outcome(
            run(printed(document())), dataclasses.replace(FACTS, stop_early=mode)
        )
        assert isinstance(outcome, Judged) and outcome.status == CaseStatus.passed


@pytest.mark.slow  # a second of real invocations: the full suite and CI run it
def test_the_real_runners_early_stop_is_believed_and_judged_alike(tmp_path: Path) -> None:
    """The runner in-process, its result printed as the container prints it: the worker takes
    its stopped result, with the verdict of every invocation run."""
    project = write(
        tmp_path / "p",
        {
            "agents/calc.yaml": """
                version: "1.0"
                name: calc
                description: Adds.
                type: tool
                tool_name: ops.add
            """,
            "tools/ops.py": """
                def add(payload: dict) -> dict:
                    return {"sum": payload["a"] + payload["b"]}
            """,
            "tests/calc.yaml": """
                tests:
                  - name: adds
                    payload: '{"a": 2, "b": 2}'
                    runs: 10
                    success_threshold: 70
                    expected_result: output.sum == 5
            """,
        },
    )
    facts = dataclasses.replace(TEN, stop_early="failing")
    outcomes = []
    for mode in ("failing", None):
        result = run_case(project, "tests/calc.yaml", "adds", Isolation(), stop_early=mode)
        stdout = framed(dataclasses.replace(result, nonce=NONCE).to_json()).encode()
        outcomes.append(case_outcome(run(stdout), facts))
    stopped, full = outcomes
    assert isinstance(stopped, Judged) and isinstance(full, Judged)
    assert len(stopped.result.invocations) == 4 and len(full.result.invocations) == 10
    assert (
        (stopped.status, stopped.passed)
        == (full.status, full.passed)
        == (
            CaseStatus.failed,
            False,
        )
    )
    # And without early stop asked for, the same stopped result is not the runner's.
    refused = not_judged(
        case_outcome(
            run(framed(json.dumps(stopped.result.as_dict())).encode()),
            dataclasses.replace(facts, stop_early=None),
        )
    )
    assert "not trusted" in refused.reason


def test_the_worker_asks_for_decided_only_when_nothing_needs_a_full_rate() -> None:
    on, off = Settings(), Settings(early_stop=False)
    assert early_stop_mode(on, None, "threshold") == "decided"
    assert early_stop_mode(on, "label:branch=main", "threshold") == "failing"  # a baseline
    assert early_stop_mode(on, None, "threshold", labelled=True) == "failing"  # a baseline-to-be
    assert early_stop_mode(on, None, "wilson") is None  # the Wilson rule stops by itself
    assert early_stop_mode(off, None, "threshold") is None
    assert early_stop_mode(off, "label:branch=main", "wilson") is None
    assert runner_argv(on, "tests/calc.yaml", "adds")[-1] == "--handoff"
    assert runner_argv(on, "tests/calc.yaml", "adds", stop_early="failing")[-1] == (
        "--stop-early=failing"
    )


def test_the_runners_command_line_takes_the_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = write(
        tmp_path / "p",
        {
            "agents/calc.yaml": """
                version: "1.0"
                name: calc
                description: Adds.
                type: tool
                tool_name: ops.add
            """,
            "tools/ops.py": """
                def add(payload: dict) -> dict:
                    return {"sum": payload["a"] + payload["b"]}
            """,
            "tests/calc.yaml": """
                tests:
                  - name: adds
                    payload: '{"a": 2, "b": 2}'
                    runs: 3
                    expected_result: output.sum == 5
            """,
        },
    )
    argv = ["run-case", "--project", str(project), "--suite=tests/calc.yaml", "--case=adds"]
    assert runner_main([*argv, "--stop-early=decided"]) == 0
    result = parse_runner_output(capsys.readouterr().out.encode())
    assert (len(result.invocations), result.runs, result.passed) == (1, 3, False)
    with pytest.raises(SystemExit):  # argparse: not one of the modes
        runner_main([*argv, "--stop-early=soon"])
    assert "invalid choice: 'soon'" in capsys.readouterr().err

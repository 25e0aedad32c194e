"""The project's plan (gate_runner/plan.py): every case prepared once at image build time,
read by the case containers, and never a different verdict from preparing the suite."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gate_runner.case import run_case
from gate_runner.plan import planned_case, read_plan
from gate_runner.plan_build import build_plan, write_plan
from tests.fixtures.projects import AGENTS, write
from tests.fixtures.runner import prepared_view

CALC = {k: v for k, v in AGENTS.items() if k in ("agents/calc.yaml", "tools/math_ops.py")}
SUITE = """\
agent: calc
tests:
  - name: adds
    payload: '{"a": 1, "b": 2}'
    expected_result: output.sum == 3
  - name: dated
    builder_args: {when: 2026-12-04}
    payload: '{"a": 1, "b": 1}'
    expected_result: output.sum == 2
  - name: bad_expression
    payload: '{"a": 1, "b": 1}'
    expected_result: output.sum ===
"""


def project(tmp_path: Path) -> Path:
    return write(
        tmp_path / "p",
        {
            **CALC,
            "tests/calc.yaml": SUITE,
            "tests/ghost.yaml": "agent: nobody\ntests:\n  - name: lost\n    payload: '{}'\n",
            "tests/broken.yaml": "tests: [{name: x, runs: 1000}]\n",
            "tests/files/data.yaml": "not: a suite\n",
        },
    )


def as_read(plan: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(plan))  # as a case container reads it


def test_the_plan_holds_each_case_as_preparing_its_suite_would(tmp_path: Path) -> None:
    root = project(tmp_path)
    plan = as_read(build_plan(root))
    assert sorted(plan["suites"]) == ["tests/broken.yaml", "tests/calc.yaml", "tests/ghost.yaml"]
    for suite, case in [
        ("tests/calc.yaml", "adds"),
        ("tests/calc.yaml", "bad_expression"),
        ("tests/ghost.yaml", "lost"),
        ("tests/broken.yaml", "x"),
        ("tests/calc.yaml", "no_such_case"),
    ]:
        assert prepared_view(root, suite, case, plan) == prepared_view(root, suite, case, None)
    assert plan["suites"]["tests/calc.yaml"]["cases"]["adds"]["resolved"]["payload"] == (
        '{"a": 1, "b": 2}'
    )
    assert "does not exist" in plan["suites"]["tests/ghost.yaml"]["cases"]["lost"]["error"]
    assert "invalid suite" in plan["suites"]["tests/broken.yaml"]["error"]


def test_a_case_json_would_change_is_left_to_its_suite(tmp_path: Path) -> None:
    root = project(tmp_path)
    plan = as_read(build_plan(root))
    # builder_args holds a date, which JSON would turn into a string.
    assert planned_case(plan, "tests/calc.yaml", "dated") is None
    assert prepared_view(root, "tests/calc.yaml", "dated", plan) == prepared_view(
        root, "tests/calc.yaml", "dated", None
    )


def test_the_runner_judges_by_the_plan_it_is_given(tmp_path: Path) -> None:
    """The plan is what the case container reads: a case's verdict follows it (which is why
    only the image build, as root, may write it)."""
    root = project(tmp_path)
    plan = as_read(build_plan(root))
    assert run_case(root, "tests/calc.yaml", "adds", plan=plan).passed
    resolved = plan["suites"]["tests/calc.yaml"]["cases"]["adds"]["resolved"]
    resolved["expected_result"] = "output.sum == 4"
    failed = run_case(root, "tests/calc.yaml", "adds", plan=plan)
    assert not failed.passed and "output.sum == 4" in str(failed.failure_reason)


def test_writing_a_plan_never_fails_and_reads_back(tmp_path: Path) -> None:
    root = project(tmp_path)
    out = tmp_path / "plan.json"
    assert write_plan(root, str(out), None) == 0
    assert read_plan(str(out)) == as_read(build_plan(root))
    assert write_plan(root, str(tmp_path / "missing" / "plan.json"), None) == 0  # cannot open
    # A project that is not there: a plan of nothing, still no failure.
    empty = tmp_path / "empty.json"
    assert write_plan(tmp_path / "nothing", str(empty), None) == 0
    assert os.path.exists(empty)

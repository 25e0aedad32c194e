"""Builders: fresh per invocation, their context visible to assertions as build() left it,
and cleanup's return contract, also after a timeout."""

from pathlib import Path

import pytest

from gate_runner.contract import CaseResult
from tests.fixtures.projects import builder_project
from tests.fixtures.runner import judged as judge


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builder_project(tmp_path_factory.mktemp("builders") / "p")


def judged(project: Path, case: str) -> CaseResult:
    return judge(project, "tests/refunder.yaml", case)


@pytest.mark.parametrize(
    "case",
    [
        "context_and_files_reach_the_agent",
        "async_builder_text_payload",
    ],
)
def test_builder_cases_pass(project: Path, case: str) -> None:
    result = judged(project, case)
    assert result.passed, result.failure_reason


def test_each_invocation_gets_a_fresh_module_and_context(project: Path) -> None:
    result = judged(project, "context_and_files_reach_the_agent")
    assert [inv.output["charge_id"] for inv in result.invocations] == ["ch_4200_1", "ch_4200_1"]
    logs = [s.metadata["message"] for s in result.invocations[0].traces if s.type == "log"]
    assert logs == ["built ch_4200_1"]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("cleanup_false_fails", "builder cleanup returned False"),
        ("cleanup_wrong_type_fails", "builder cleanup must return bool or None, got str"),
        ("cleanup_raising_fails", "builder cleanup raised: could not delete the charge"),
        (
            "build_returning_an_int_fails",
            "builder 'bad_return' build() raised AgentRunError: builder build() must return str or "
            "dict, got int",
        ),
    ],
)
def test_cleanup_return_contract(project: Path, case: str, reason: str) -> None:
    result = judged(project, case)
    assert not result.passed
    assert reason in (result.invocations[0].failure_reason or "")


@pytest.mark.slow
def test_cleanup_runs_after_a_timeout_with_the_built_context(project: Path, tmp_path: Path) -> None:
    suite = project / "tests" / "late.yaml"
    suite.write_text(
        "agent: refunder\ntests:\n  - name: slow\n    builder: make_charge\n    timeout_s: 1\n"
        f"    builder_args: {{amount: 7, sleep: 30, marker_dir: '{tmp_path}'}}\n"
        '    expected_result: status == "failed" and "timed out" in error\n'
    )
    result = judge(project, "tests/late.yaml", "slow")
    assert result.passed, result.failure_reason
    marker = tmp_path / "ch_7_1"
    assert marker.read_text() == "None"  # cleanup saw no output: the run never finished

"""Mocks: the resolution ladders, replacement only, the four strict flags, and mocked calls
checked against the real signature."""

from pathlib import Path

import pytest

from gate_runner.mocks import normalise
from gate_service.runner_contract import CaseResult
from tests.fixtures.projects import mock_project
from tests.fixtures.runner import judged as judge


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mock_project(tmp_path_factory.mktemp("mocks") / "p")


def judged(project: Path, case: str) -> CaseResult:
    return judge(project, "tests/crm-bot.yaml", case)


def test_name_normalisation() -> None:
    assert normalise("api:weather-v2.lookup") == ["api", "weather_v2", "lookup"]
    assert normalise("domain-check") == ["domain_check"]


def test_every_phase_mocked_under_all_strict_flags(project: Path) -> None:
    result = judged(project, "every_phase_mocked_under_all_strict_flags")
    assert result.passed, result.failure_reason
    spans = result.invocations[0].traces
    assert [s.metadata["mocked"] for s in spans if s.type == "tool_call"] == [True, True]
    assert result.invocations[0].run_context["middleware_mocked"] is True


def test_lenient_mode_runs_real_phases_and_mocked_tools(project: Path) -> None:
    result = judged(project, "lenient_without_mocks_runs_the_real_code")
    assert result.passed, result.failure_reason


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (
            "mocked_call_with_a_mistyped_argument_fails",
            "mocked call to data.customer.add_customer does not fit its signature: argument 'age' "
            "should be int, got str",
        ),
        (
            "strict_mocks_without_a_tool_mock",
            "strict_mocks: data.customer.add_customer would run for real",
        ),
        (
            "strict_hook_mocks_without_a_hook_mock",
            "strict_hook_mocks: the real hook before() would run for data.customer.add_customer",
        ),
        (
            "strict_middleware_mocks_without_a_middleware_mock",
            "strict_middleware_mocks: the real middleware before() would run for crm-bot",
        ),
        (
            "strict_guardrail_mocks_without_a_guardrail_mock",
            "strict_guardrail_mocks: the real custom guardrail 'domain-check' would run (input)",
        ),
    ],
)
def test_violations_fail_the_invocation(project: Path, case: str, reason: str) -> None:
    result = judged(project, case)
    assert not result.passed
    failures = result.invocations[0].failed_assertions
    # Said once (issue 10, rule 8): not again as "agent error: ..." of the failed run.
    assert [f for f in failures if reason in f] == [failures[0]] and len(failures) == 1, failures

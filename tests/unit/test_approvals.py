"""Approvals scripted by approval_decisions (spec 8.5)."""

from pathlib import Path

import pytest

from tests.fixtures.projects import approval_project
from tests.fixtures.runner import judged


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return approval_project(tmp_path_factory.mktemp("approvals") / "p")


@pytest.mark.parametrize(
    ("suite", "case"),
    [
        ("tests/payments.yaml", "approved_refund_runs"),
        ("tests/payments.yaml", "small_refunds_need_no_approval"),
        ("tests/payments.yaml", "unanswered_approval_pauses_the_run"),
        ("tests/payments.yaml", "params_that_do_not_match_leave_it_pending"),
        ("tests/payments.yaml", "rejection_fails_the_run"),
        ("tests/payments-lenient.yaml", "rejection_continues_with_the_model_told"),
    ],
)
def test_approval_flows(project: Path, suite: str, case: str) -> None:
    result = judged(project, suite, case)
    assert result.passed, result.failure_reason


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (
            "strict_unused_decision_fails",
            "strict_approval_decisions: the decision for billing.refund (approve) was never used",
        ),
        (
            "strict_unanswered_approval_fails",
            "strict_approval_decisions: no approval_decisions entry answered the approval of "
            "billing.refund",
        ),
    ],
)
def test_strict_approval_decisions(project: Path, case: str, reason: str) -> None:
    result = judged(project, "tests/payments.yaml", case)
    assert not result.passed
    assert any(reason in f for f in result.invocations[0].failed_assertions), result.failure_reason


def test_no_expected_result_fails_a_paused_run(project: Path) -> None:
    suite = project / "tests" / "paused.yaml"
    suite.write_text("agent: payments\ntests:\n  - name: paused\n    payload: refund 100\n")
    result = judged(project, "tests/paused.yaml", "paused")
    assert not result.passed
    assert "status 'awaiting_approval'" in (result.failure_reason or "")


def test_an_unanswered_approval_names_the_tool_and_its_params(project: Path) -> None:
    suite = project / "tests" / "unanswered.yaml"
    suite.write_text(
        "agent: payments\ntests:\n  - name: waits\n    payload: refund 100\n"
        "    expected_result: output.refund.ok == true\n"
    )
    result = judged(project, "tests/unanswered.yaml", "waits")
    (reason,) = result.invocations[0].failed_assertions
    assert reason.endswith(
        'the approval of billing.refund with params {"amount": 100} was never answered'
    ), reason


def test_a_decision_whose_params_expression_errors_says_so(project: Path) -> None:
    suite = project / "tests" / "typo.yaml"
    suite.write_text(
        "agent: payments\ntests:\n  - name: typo\n    payload: refund 100\n"
        "    approval_decisions:\n"
        "      - {tool: billing.refund, params: params.amonut == 100, decision: approve}\n"
        "      - {tool: billing.notify, decision: approve}\n"
        '    expected_result: status == "awaiting_approval"\n'
    )
    result = judged(project, "tests/typo.yaml", "typo")
    assert not result.passed
    assert any(
        "the params expression `params.amonut == 100` of the decision for billing.refund could "
        "not be evaluated: no key amonut" in f
        for f in result.invocations[0].failed_assertions
    ), result.invocations[0].failed_assertions

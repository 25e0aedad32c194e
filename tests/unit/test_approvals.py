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


def test_a_decision_whose_context_is_mistyped_says_so(project: Path) -> None:
    # A key missing from the builder context is the test's own mistake, as in a tool-call
    # filter: it fails the invocation, naming the expression and the error.
    suite = project / "tests" / "typo.yaml"
    suite.write_text(
        "agent: payments\ntests:\n  - name: typo\n    payload: refund 100\n"
        "    approval_decisions:\n"
        "      - {tool: billing.refund, params: params.amount == context.amonut, "
        "decision: approve}\n"
        "      - {tool: billing.notify, decision: approve}\n"
        '    expected_result: status == "awaiting_approval"\n'
    )
    result = judged(project, "tests/typo.yaml", "typo")
    assert not result.passed
    assert any(
        "the params expression `params.amount == context.amonut` of the decision for "
        "billing.refund could not be evaluated: no key amonut" in f
        for f in result.invocations[0].failed_assertions
    ), result.invocations[0].failed_assertions


# -- issue 19, item 9: a params expression the call's params cannot answer does not match ---


def test_a_decision_the_params_cannot_answer_does_not_match_and_the_next_is_tried(
    project: Path,
) -> None:
    suite = project / "tests" / "next.yaml"
    suite.write_text(
        "agent: payments\ntests:\n"
        "  - name: next_decision_approves\n    payload: refund 100\n"
        "    approval_decisions:\n"
        "      - {tool: billing.refund, params: params.reason == 'dup', decision: reject}\n"
        "      - {tool: billing.refund, decision: approve}\n"
        "      - {tool: billing.notify, decision: approve}\n"
        "    expected_result: output.refund.ok == true and output.notify.sent == true\n"
        "  - name: none_answers\n    payload: refund 100\n"
        "    approval_decisions:\n"
        "      - {tool: billing.refund, params: params.reason == 'dup', decision: approve}\n"
        "    expected_result: output.refund.ok == true\n"
    )
    answered = judged(project, "tests/next.yaml", "next_decision_approves")
    assert answered.passed, answered.failure_reason
    pending = judged(project, "tests/next.yaml", "none_answers")
    (reason,) = pending.invocations[0].failed_assertions
    assert reason.endswith(
        'the approval of billing.refund with params {"amount": 100} was never answered (the '
        "decision for billing.refund did not match: `params.reason == 'dup'` could not be "
        'evaluated: no key reason in {"amount": 100})'
    ), reason


# -- issue 19, item 11: a decision's `tool` is the canonical ref ---------------------------


def test_a_decision_matches_the_canonical_ref_only(project: Path) -> None:
    # SDK TestApprovalDecision.tool: "Canonical tool ref of the approval to match." A bare
    # name never matches, and says so rather than leave the run waiting unexplained.
    suite = project / "tests" / "bare.yaml"
    suite.write_text(
        "agent: payments\ntests:\n  - name: bare_name\n    payload: refund 100\n"
        "    approval_decisions:\n"
        "      - {tool: refund, decision: approve}\n"
        "      - {tool: billing.notify, decision: approve}\n"
        "    expected_result: output.refund.ok == true\n"
    )
    result = judged(project, "tests/bare.yaml", "bare_name")
    assert result.invocations[0].status == "awaiting_approval"
    assert result.invocations[0].failed_assertions[-1] == (
        "approval_decisions: the decision for refund names the bare name of billing.refund, "
        "which was waiting for approval; a decision's tool is the canonical ref (billing.refund)"
    ), result.invocations[0].failed_assertions

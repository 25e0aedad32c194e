"""approval.inputs (issue 19, item 2; SDK ApprovalConfig.inputs, spec 8.5): a generated tool
whose result a person types; the run pauses until an `approve` decision's `response` answers
it, and an input nobody answers leaves the run awaiting approval."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.projects import write
from tests.fixtures.runner import judged


def login_agent(name: str, sensitive: bool = False, on_rejection: str = "fail") -> str:
    return f"""
        version: "1.0"
        name: {name}
        description: Asks a person for an MFA code.
        model: openai/gpt-4o
        system_prompt: Log in.
        approval:
          on_rejection: {on_rejection}
          inputs:
            - get_mfa:
                prompt: Use this tool when the login needs an MFA code.
                label: MFA code
                sensitive: {str(sensitive).lower()}
                params:
                  - reason: str
    """


# The answer says whether the model was offered the generated tool, with its schema.
MODEL = """
    def respond(messages, tools, context):
        done = [m for m in messages if m["role"] == "tool"]
        if not done:
            return {"tool_calls": [{"name": "get_mfa", "arguments": {"reason": "login"}}]}
        offered = [(t["function"]["name"], t["function"]["parameters"].get("required")) for t in tools]
        seen = "offered" if offered == [("get_mfa", ["reason"])] else f"offered {offered}"
        return {"content": f"code {done[0]['content']} ({seen})"}
"""

LOGIN = {
    "agents/login.yaml": login_agent("login"),
    "agents/secret-login.yaml": login_agent("secret-login", sensitive=True),
    "agents/soft-login.yaml": login_agent("soft-login", on_rejection="continue"),
    "tests/models/login.py": MODEL,
    "tests/models/secret-login.py": MODEL,
    "tests/models/soft-login.py": MODEL,
    "tests/login.yaml": """
        tests:
          - name: the_response_is_the_tools_result
            payload: log in
            strict_approval_decisions: true
            approval_decisions:
              - {tool: get_mfa, params: params.reason == "login", decision: approve, response: "123456"}
            expected_result: output == "code 123456 (offered)"
            expected_tool_calls: [{get_mfa: 'params.reason == "login" and result == "123456"'}]
          - name: an_unanswered_input_pauses_the_run
            payload: log in
          - name: strict_names_the_unanswered_input
            payload: log in
            strict_approval_decisions: true
          - name: a_rejected_input_fails_the_run
            payload: log in
            approval_decisions: [{tool: get_mfa, decision: reject, reason: no codes today}]
            expected_result: 'status == "failed" and "input get_mfa was rejected: no codes today" in error'
          - name: an_approve_without_a_response_answers_nothing
            payload: log in
            approval_decisions: [{tool: get_mfa, decision: approve}]
            expected_result: status == "awaiting_approval"
    """,
    "tests/secret-login.yaml": """
        tests:
          - name: a_sensitive_answer_stays_out_of_the_trace
            payload: log in
            approval_decisions: [{tool: get_mfa, decision: approve, response: "654321"}]
            expected_result: output == "code 654321 (offered)"
    """,
    "tests/soft-login.yaml": """
        tests:
          - name: a_rejection_tells_the_model
            payload: log in
            approval_decisions: [{tool: get_mfa, decision: timeout}]
            expected_result: '"timed out waiting for input" in output'
    """,
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("inputs") / "p", LOGIN)


@pytest.mark.parametrize(
    ("suite", "case"),
    [
        ("tests/login.yaml", "the_response_is_the_tools_result"),
        ("tests/login.yaml", "a_rejected_input_fails_the_run"),
        ("tests/soft-login.yaml", "a_rejection_tells_the_model"),
    ],
)
def test_answered_inputs(project: Path, suite: str, case: str) -> None:
    result = judged(project, suite, case)
    assert result.passed, result.failure_reason


def test_an_unanswered_input_fails_a_case_without_expected_result(project: Path) -> None:
    result = judged(project, "tests/login.yaml", "an_unanswered_input_pauses_the_run")
    inv = result.invocations[0]
    assert inv.status == "awaiting_approval"
    assert inv.failed_assertions == [
        "the run ended with status 'awaiting_approval', expected 'completed'; the input "
        'request get_mfa ("MFA code") with params {"reason": "login"} was never answered'
    ]


def test_strict_approval_decisions_names_the_input(project: Path) -> None:
    result = judged(project, "tests/login.yaml", "strict_names_the_unanswered_input")
    assert result.invocations[0].failed_assertions == [
        "strict_approval_decisions: no approval_decisions entry answered the input request "
        'get_mfa ("MFA code") with params {"reason": "login"}'
    ]


def test_an_approve_without_a_response_is_the_tests_mistake(project: Path) -> None:
    result = judged(project, "tests/login.yaml", "an_approve_without_a_response_answers_nothing")
    assert result.invocations[0].failed_assertions == [
        "approval_decisions: the approve decision for the input get_mfa has no response; an "
        "input is answered with the text in `response`"
    ]


def test_a_sensitive_answer_reaches_the_model_and_not_the_trace(project: Path) -> None:
    result = judged(project, "tests/secret-login.yaml", "a_sensitive_answer_stays_out_of_the_trace")
    assert result.passed, result.failure_reason
    (call,) = [s for s in result.invocations[0].traces if s.type == "tool_call"]
    assert call.metadata["result"] == "[sensitive]"
    (answered,) = [s for s in result.invocations[0].traces if s.type == "approval"]
    assert "654321" not in str(answered.metadata)

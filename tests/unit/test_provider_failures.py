"""Provider failures are not agent failures (issue 38, item 5; docs/semantics.md): a case whose
verdict hangs on runs that failed because a model call failed outside the agent (a refused key,
an unknown model, an unreachable or failing provider, a budget) is not judged (case_error, so
the gate ends error); a request the provider rejected as such stays the agent's failure; a
fallback model that answers, or a case that asserts on the failure, is judged as it ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate_runner import gateway_wire as wire
from gate_runner.contract import CaseResult
from gate_runner.invocations import Isolation
from gate_runner.runtime_errors import ModelCallError
from gate_runner.verdict import unjudged_reason
from tests.fixtures.fake_gateway import FakeGateway, reply
from tests.fixtures.projects import write
from tests.fixtures.runner import judged

UNAUTHORIZED = wire.GatewayError(
    kind="provider",
    message="openai answered HTTP 401 to POST /v1/chat/completions: Incorrect API key provided",
    provider_status=401,
)
BAD_REQUEST = wire.GatewayError(
    kind="provider",
    message="openai answered HTTP 400 to POST /v1/chat/completions: maximum context length",
    provider_status=400,
)
UNREACHABLE = wire.GatewayError(
    kind="provider",
    message="openai could not be reached at POST /v1/chat/completions: connection refused",
)

PROJECT = {
    "agents/bot.yaml": """
        version: "1.0"
        name: bot
        description: Talks to a provider.
        model: openai/gpt-4o
        system_prompt: Be brief.
        retry_options: {attempts: 1, initial_delay: 0, max_delay: 1}
    """,
    "agents/backed.yaml": """
        version: "1.0"
        name: backed
        description: Has a fallback model.
        model: openai/gpt-4o
        fallback_model: anthropic/claude-haiku-4-5
        system_prompt: Be brief.
        retry_options: {attempts: 1, initial_delay: 0, max_delay: 1}
    """,
    "tests/bot.yaml": """
        tests:
          - name: answers
            payload: hi
            expected_result: output == "hello from the fake provider"
          - name: answers_twice_in_three
            payload: hi
            runs: 3
            success_threshold: 60
            expected_result: output == "hello from the fake provider"
          - name: expects_the_failure
            payload: hi
            expected_result: status == "failed"
    """,
    "tests/backed.yaml": """
        tests:
          - name: answers
            payload: hi
            expected_result: output == "hello from the fake provider"
    """,
}


def run(gateway: FakeGateway, tmp_path: Path, suite: str, case: str) -> CaseResult:
    return judged(
        write(tmp_path / "p", PROJECT),
        suite,
        case,
        isolation=Isolation(gateway=gateway.channel),
        judgeable=False,
        fresh=gateway.rewind,
    )


@pytest.mark.parametrize(
    ("metadata", "outside"),
    [
        ({"error_kind": "provider", "provider_status": 401}, True),
        ({"error_kind": "provider", "provider_status": 403}, True),
        ({"error_kind": "provider", "provider_status": 404}, True),  # an unknown model
        ({"error_kind": "provider", "provider_status": 503}, True),
        ({"error_kind": "provider", "provider_status": 200}, True),  # not its API's shape
        ({"error_kind": "provider"}, True),  # no answer: unreachable, timed out
        ({"error_kind": "provider", "provider_status": 400}, False),  # the request itself
        ({"error_kind": "provider", "provider_status": 422}, False),
        ({"error_kind": "rate_limited", "provider_status": 429}, True),
        ({"error_kind": "budget"}, True),
        ({"error_kind": "no_route"}, True),
        ({"error_kind": "deadline"}, True),
        ({"error_kind": "unreachable"}, True),
        ({"error_kind": "bad_reply"}, True),
        ({"error_kind": "bad_request"}, False),  # over the wire's cap: the agent's prompt
        ({}, False),  # a scripted model's own error
    ],
)
def test_which_model_call_failures_are_outside_the_agent(
    metadata: dict[str, object], outside: bool
) -> None:
    assert ModelCallError("model call to m failed: x", metadata).outside_the_agent is outside


@pytest.mark.parametrize(
    ("runs", "threshold", "successes", "failures", "unjudged"),
    [
        (1, 100, 0, 1, True),  # the one run could have passed
        (3, 60, 2, 1, False),  # passes without it
        (3, 100, 1, 1, False),  # a run failed on its own: fails whatever the other did
        (3, 60, 1, 1, True),  # 2 of 3 would pass: the provider decides it
        (3, 60, 0, 1, False),  # at most 1 of 3 even with it
        (1, 100, 0, 0, False),  # no provider failure: an ordinary verdict
    ],
)
def test_a_case_is_unjudged_only_when_provider_failures_decide_its_verdict(
    runs: int, threshold: int, successes: int, failures: int, unjudged: bool
) -> None:
    reason = unjudged_reason(
        runs=runs,
        success_threshold=threshold,
        successes=successes,
        provider_failures=[(i, f"model call failed {i}") for i in range(failures)],
    )
    assert (reason is not None) is unjudged
    if reason is not None:
        assert reason.startswith(f"{failures} of {runs} invocation(s) could not be judged")
        assert "model call failed 0" in reason and "keys, routes or budgets" in reason


def test_a_401_is_not_the_agents_failure(fake_gateway: FakeGateway, tmp_path: Path) -> None:
    fake_gateway.script = [UNAUTHORIZED]
    result = run(fake_gateway, tmp_path, "tests/bot.yaml", "answers")
    assert not result.passed
    assert result.case_error is not None
    assert "HTTP 401" in result.case_error and "Incorrect API key" in result.case_error
    assert result.failure_reason == result.case_error
    assert result.invocations[0].status == "failed"  # the run as it ended, kept for its trace


def test_an_unreachable_provider_is_not_the_agents_failure(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    fake_gateway.script = [UNREACHABLE]
    result = run(fake_gateway, tmp_path, "tests/bot.yaml", "answers")
    assert result.case_error is not None and "could not be reached" in result.case_error


def test_a_request_the_provider_rejects_is_the_agents_failure(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    fake_gateway.script = [BAD_REQUEST]
    result = run(fake_gateway, tmp_path, "tests/bot.yaml", "answers")
    assert not result.passed and result.case_error is None
    assert "HTTP 400" in (result.failure_reason or "")


def test_runs_that_decide_nothing_leave_the_verdict_alone(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    # Two of three runs answer: 67% passes 60% whatever the third would have done.
    fake_gateway.script = [reply(), UNAUTHORIZED, reply()]
    result = run(fake_gateway, tmp_path, "tests/bot.yaml", "answers_twice_in_three")
    assert result.passed and result.case_error is None


def test_a_case_that_asserts_on_the_failure_is_judged_by_its_assertion(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    fake_gateway.script = [UNAUTHORIZED]
    result = run(fake_gateway, tmp_path, "tests/bot.yaml", "expects_the_failure")
    assert result.passed and result.case_error is None


def test_a_fallback_that_answers_is_judged_as_the_run_went(
    fake_gateway: FakeGateway, tmp_path: Path
) -> None:
    fake_gateway.script = [UNAUTHORIZED, reply()]
    result = run(fake_gateway, tmp_path, "tests/backed.yaml", "answers")
    assert result.passed and result.case_error is None
    assert [r["model"] for r in fake_gateway.requests] == [
        "openai/gpt-4o",
        "anthropic/claude-haiku-4-5",
    ]
    assert result.invocations[0].run_context["fallback_model_used"] == (
        "anthropic/claude-haiku-4-5"
    )

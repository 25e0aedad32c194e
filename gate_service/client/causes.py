"""Failed cases grouped by the kind of their first failing check, for the gate page and
`gate submit`: twenty cases that failed for one cause read as one line with a count, and a
provider's or the configuration's failure reads apart from the agent's behaviour.

The kind is read from the case's stored reason, whose leading words are the runner's and the
worker's own (``expected_result `…` was false``, ``agent error: output_schema …``, ``the
case container ran out of memory``). What follows those words is the bundle's text: it can
make its own case land in another group, nothing more, and is only ever searched with plain
``str`` operations (linear, no pattern).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from .shapes import CaseView


class Cause(StrEnum):
    result = "result"
    tool = "tool"
    child = "child"
    schema = "schema"
    run_error = "run_error"
    timeout = "timeout"
    status = "status"
    strict = "strict"
    limit = "limit"
    untrusted = "untrusted"
    setup = "setup"
    provider = "provider"
    not_judged = "not_judged"
    regression = "regression"
    other = "other"


@dataclass(frozen=True)
class CauseInfo:
    title: str  # the group's heading, after its count
    agents: bool  # the agent's behaviour (True), or the gate's, the test's or a provider's


CAUSES: dict[Cause, CauseInfo] = {
    Cause.result: CauseInfo("expected_result was false", True),
    Cause.tool: CauseInfo("a tool call was missing, unexpected or out of order", True),
    Cause.child: CauseInfo("a child agent was not triggered as expected", True),
    Cause.schema: CauseInfo("the answer did not match the agent's output_schema", True),
    Cause.run_error: CauseInfo("the agent's run raised an error", True),
    Cause.timeout: CauseInfo("timed out", True),
    Cause.status: CauseInfo("the run ended blocked, cancelled or waiting", True),
    Cause.strict: CauseInfo("a strict mock or approval rule was broken", True),
    Cause.limit: CauseInfo("ran past a limit (memory, output, scratch space)", True),
    Cause.regression: CauseInfo("regressed against the baseline", True),
    Cause.untrusted: CauseInfo(
        "its result was not believed (output past the cap, a result block not the runner's)",
        True,
    ),
    Cause.other: CauseInfo("another check failed", True),
    Cause.setup: CauseInfo(
        "the test's own setup broke (project, mocks or builder), not the agent", False
    ),
    Cause.provider: CauseInfo(
        "a provider or configuration error (keys, routes, budgets), not the agent", False
    ),
    Cause.not_judged: CauseInfo("could not be judged (the gate's or the runner's failure)", False),
}

FIRST_FAILURE = "first failure (invocation "
AGENT_ERROR = "agent error: "
NOT_THE_AGENTS = "because a model call failed for a reason that is not the agent's"
SETUP_STAGES = ("loading the project raised ", "the mocks module ", "builder ", "the runner ")


def first_check(reason: str) -> str:
    """The first failing check of a case's reason: after ``first failure (invocation N): ``
    when the runner's case sentence has one, else the reason itself."""
    at = reason.find(FIRST_FAILURE)
    if at < 0:
        return reason
    colon = reason.find("): ", at)
    return reason[colon + 3 :] if colon >= 0 else reason


def _agent_error(error: str) -> Cause:
    if error.startswith("output_schema "):
        return Cause.schema
    if error.startswith("the invocation's report is malformed"):
        return Cause.untrusted
    if error.startswith(("the invocation could not start", "the invocation's report was")):
        return Cause.limit  # its process could not be started (pids), or said too much
    if error.startswith("timed out after ") or (
        error.startswith("agent ") and " timed out after " in error[:300]
    ):
        return Cause.timeout
    return Cause.run_error


def check_cause(check: str) -> Cause:
    """The kind of one failed check, by the runner's words that start it."""
    if check.startswith("expected_result `"):
        # `status == "completed"` against a crash: the crash is the cause.
        at = check.rfind("; " + AGENT_ERROR)
        return _agent_error(check[at + 2 + len(AGENT_ERROR) :]) if at >= 0 else Cause.result
    if check.startswith(AGENT_ERROR):
        return _agent_error(check[len(AGENT_ERROR) :])
    if check.startswith(("expected_tool_call", "expected a call to ", "expected no call to ")):
        return Cause.tool
    if check.startswith("expected_child_agents"):
        return Cause.child
    if check.startswith("the run ended with status "):
        return Cause.status
    if check.startswith("strict_"):
        return Cause.strict
    if check.startswith(("the invocation printed more than ", "the case's scratch space")):
        return Cause.limit
    if check.startswith("builder cleanup"):  # timed out, raised, returned False, ...
        return Cause.setup
    if check.startswith("the runner could not judge"):  # before "the runner ... raised "
        return Cause.not_judged
    if check.startswith(SETUP_STAGES) and " raised " in check[:400]:
        return Cause.setup
    return Cause.other


def case_cause(case: CaseView) -> Cause | None:
    """Why the case did not pass, or None when it passed (or has no verdict yet)."""
    if case.reused_from:
        return None
    reason = case.failure_reason or ""
    if case.status == "error":
        if NOT_THE_AGENTS in reason:
            return Cause.provider
        return Cause.not_judged  # the gate's deadline cut it short, the runner broke, ...
    if case.passed is True or case.status != "failed":
        return Cause.regression if case.regression_level == "regression" else None
    if reason.startswith("the case container ran past its hard deadline"):
        return Cause.timeout
    if reason.startswith("the case container ran out of memory"):
        return Cause.limit
    if reason.startswith("the case's result was not trusted"):
        return Cause.untrusted  # the bundle's doing: judged failed, not left unjudged
    return check_cause(first_check(reason))


@dataclass(frozen=True)
class Group:
    cause: Cause
    cases: list[CaseView]

    @property
    def info(self) -> CauseInfo:
        return CAUSES[self.cause]

    @property
    def line(self) -> str:
        """``21 cases: the answer did not match the agent's output_schema``."""
        n = len(self.cases)
        return f"{n} case{'s' if n != 1 else ''}: {self.info.title}"


def failure_groups(cases: Sequence[CaseView]) -> list[Group]:
    """The cases that did not pass, by cause: the agent's behaviour first, then the rest;
    the largest group first within each; each group's cases in the order given."""
    by_cause: dict[Cause, list[CaseView]] = {}
    for case in cases:
        cause = case_cause(case)
        if cause is not None:
            by_cause.setdefault(cause, []).append(case)
    order = list(Cause)
    return sorted(
        (Group(cause, listed) for cause, listed in by_cause.items()),
        key=lambda g: (not g.info.agents, -len(g.cases), order.index(g.cause)),
    )

"""Human-in-the-loop approvals in a gate (spec §8.5): scripted by `approval_decisions`.

When an LLM agent calls a tool its `approval.tools` gate (a condition over `param.*` and
`context.*`; an evaluation error means approval is required), the first unused decision
whose `tool` matches and whose `params` expression holds answers it. Without one, the run
ends `awaiting_approval` (or, with `strict_approval_decisions`, the invocation fails).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .expr import EvaluationError, ExpressionError, compile_expression
from .runtime_errors import AgentRunError


class AwaitingApproval(Exception):
    """No scripted decision answered a pending approval: the run pauses for good."""


@dataclass
class Decision:
    tool: str
    decision: str  # approve | reject | timeout
    params: str | None = None
    reason: str | None = None
    response: str | None = None  # an approval input's answer (SDK TestApprovalDecision)
    used: bool = False


@dataclass
class Approvals:
    decisions: list[Decision] = field(default_factory=list)
    strict: bool = False
    builder_context: Mapping[str, Any] = field(default_factory=dict)
    # A decision whose `params` expression could not be evaluated: the test's own mistake,
    # said in the reason instead of the decision being skipped silently.
    problems: list[str] = field(default_factory=list)

    @classmethod
    def from_case(cls, case: Mapping[str, Any], builder_context: Mapping[str, Any]) -> Approvals:
        return cls(
            decisions=[
                Decision(
                    tool=d["tool"],
                    decision=d["decision"],
                    params=d.get("params"),
                    reason=d.get("reason"),
                    response=d.get("response"),
                )
                for d in case.get("approval_decisions") or []
            ],
            strict=bool(case.get("strict_approval_decisions")),
            builder_context=builder_context,
        )

    def unused(self) -> list[Decision]:
        return [d for d in self.decisions if not d.used]

    def answer(
        self, ref: str, name: str, params: Mapping[str, Any], skipped: list[str] | None = None
    ) -> Decision | None:
        """The first unused decision for the canonical ``ref`` whose `params` holds.

        Decided (issue 19, item 11): `tool` is the canonical ref only (SDK
        TestApprovalDecision.tool: "Canonical tool ref of the approval to match"); a decision
        naming the bare ``name`` instead is said to be wrong when nothing answered. A `params`
        expression that the approval's params cannot answer (a key they lack) does not match
        and the next decision is tried (item 9; seed: "a missing key fails the predicate
        rather than raising"), with why in ``skipped``; any other error is the test's own
        mistake and fails the invocation, as a tool-call filter's does.
        """
        for decision in self.decisions:
            if decision.used or decision.tool != ref:
                continue
            if decision.params:
                try:
                    expr = compile_expression(decision.params, ("params", "context"))
                    if not expr.holds({"params": params, "context": self.builder_context}):
                        continue
                except EvaluationError as exc:
                    why = f"`{decision.params}` could not be evaluated: {exc}"
                    if "params" in exc.names:
                        if skipped is not None:
                            skipped.append(f"the decision for {decision.tool} did not match: {why}")
                    else:
                        self.problem(
                            f"approval_decisions: the params expression `{decision.params}` "
                            f"of the decision for {decision.tool} could not be evaluated: {exc}"
                        )
                    continue
                except ExpressionError as exc:
                    self.problem(f"approval_decisions: the decision for {decision.tool}: {exc}")
                    continue
            decision.used = True
            return decision
        if name != ref and any(not d.used and d.tool == name for d in self.decisions):
            self.problem(
                f"approval_decisions: the decision for {name} names the bare name of {ref}, "
                f"which was waiting for approval; a decision's tool is the canonical ref ({ref})"
            )
        return None

    def problem(self, problem: str) -> None:
        """A mistake in the scripted decisions: it fails the invocation, said once."""
        if problem not in self.problems:
            self.problems.append(problem)


def requires_approval(
    agent: Any, ref: str, name: str, params: Mapping[str, Any], context: Mapping[str, Any]
) -> bool:
    config = getattr(agent.config, "approval", None)
    if config is None:
        return False
    for entry in config.tools or []:
        tool, condition = (entry, None) if isinstance(entry, str) else next(iter(entry.items()))
        if tool not in (ref, name):
            continue
        if not condition:
            return True
        try:
            expr = compile_expression(condition, ("param", "context"))
            return bool(expr.holds({"param": params, "context": context}))
        except (ExpressionError, EvaluationError):
            return True  # spec: an evaluation error means approval is required (fails safe)
    return False


def rejection_error(decision: Decision, ref: str, what: str = "tool") -> AgentRunError:
    """``what`` is "tool" for a gated tool call, "input" for an approval input."""
    waited = "approval" if what == "tool" else "input"
    verb = f"timed out waiting for {waited}" if decision.decision == "timeout" else "was rejected"
    reason = f": {decision.reason}" if decision.reason else ""
    return AgentRunError(f"{what} {ref} {verb}{reason}")

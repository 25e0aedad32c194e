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
                )
                for d in case.get("approval_decisions") or []
            ],
            strict=bool(case.get("strict_approval_decisions")),
            builder_context=builder_context,
        )

    def unused(self) -> list[Decision]:
        return [d for d in self.decisions if not d.used]

    def answer(self, ref: str, name: str, params: Mapping[str, Any]) -> Decision | None:
        for decision in self.decisions:
            if decision.used or decision.tool not in (ref, name):
                continue
            if decision.params:
                try:
                    expr = compile_expression(decision.params, ("params", "context"))
                    if not expr.holds({"params": params, "context": self.builder_context}):
                        continue
                except (ExpressionError, EvaluationError) as exc:
                    problem = (
                        f"approval_decisions: the params expression `{decision.params}` of the "
                        f"decision for {decision.tool} could not be evaluated: {exc}"
                    )
                    if problem not in self.problems:
                        self.problems.append(problem)
                    continue
            decision.used = True
            return decision
        return None


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


def rejection_error(decision: Decision, ref: str) -> AgentRunError:
    verb = "timed out waiting for approval" if decision.decision == "timeout" else "was rejected"
    reason = f": {decision.reason}" if decision.reason else ""
    return AgentRunError(f"tool {ref} {verb}{reason}")

"""What the runtime's parts see of the invocation's runtime: ``RuntimePort``, the part of
``orchestrator.Runtime`` they use, and the shapes both sides name (a run's outcome, a frame).

The orchestrator calls its parts (an agent kind, a call phase, a tool call, triggers) and
they call back into the runtime: its state (the agents, the mocks, the approvals, the models
chosen), its deadline and token counts, a nested run. They annotate it with the protocol of
this module, never with the orchestrator's class, so the orchestrator imports its parts and
no part imports the orchestrator: the runtime's modules form no import circle. This module
imports none of them at run time (its annotations only), so it stays a leaf.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from ..approvals import Approvals
    from ..mocks import Mocks
    from ..models import GatewayChannel, Model
    from ..predefined import Predefined
    from .mcp_tools import McpTools
    from .trace import Span, Trace

# One run in progress: the trace it writes to, the span its calls open under, its context.
Frame = tuple["Trace", "Span | None", dict[str, Any]]


@dataclass
class RunOutcome:
    """What one agent run ended with, before any assertion looks at it."""

    status: str  # completed | failed | cancelled | blocked | awaiting_approval
    output: Any
    error: str | None
    run_context: dict[str, Any]
    # The run failed because a model call failed outside the agent (ModelCallError
    # .outside_the_agent): its reason. The case is then not judged on it (case.py).
    provider_failure: str | None = None

    @property
    def ended_as(self) -> str:
        """The status a run's middleware cleanup is told (SDK Middleware: "completed",
        "failed" or "cancelled"): a blocked run as it is stored. (A run left waiting for an
        approval gets no cleanup: see Runtime.run.)"""
        if self.status == "blocked":
            return str(self.run_context.get("stored_status") or "completed")
        if self.status == "awaiting_approval":
            return "cancelled"
        return self.status


class RuntimePort(Protocol):
    """The runtime of one invocation, as its parts use it (orchestrator.Runtime is one)."""

    agents: Mapping[str, Any]
    loader: Any  # the SDK's ProjectLoader, or the light path's; None outside a project
    project: Path | None
    model_mode: str | None
    gateway: GatewayChannel | None
    guardrail_model: str | None
    models: dict[str, Model]  # each agent's model, once chosen (model_choice.py)
    sessions: dict[tuple[str, str], list[dict[str, Any]]]  # session histories (sessions.py)
    mcp_tools: dict[tuple[int, str], McpTools]  # each run's MCP tools, by context and agent
    predefined: Predefined
    mocks: Mocks
    approvals: Approvals
    violations: list[str]  # strict-flag and mock-signature violations (mocking.py)

    def run(
        self,
        agent_name: str,
        payload: dict[str, Any],
        trace: Trace,
        parent: Span | None = None,
        *,
        run_id: str | None = None,
        parent_run_id: str | None = None,
    ) -> RunOutcome:
        """One agent run, from start to outcome (a triggered child's)."""
        ...

    def run_agent(
        self, name: str, payload: Any, context: dict[str, Any], trace: Trace, parent: Span | None
    ) -> Any:
        """One agent of the run, by its kind (a sequential agent's stage)."""
        ...

    def current_frame(self) -> Frame:
        """The innermost run in progress in this context."""
        ...

    def check_deadline(self) -> None:
        """Raise when the agent's own timeout or the invocation's has passed."""
        ...

    def execution_finished(self, context: dict[str, Any]) -> None:
        """``duration_ms`` and ``token_usage`` into the run's context."""
        ...

    def count_tokens(self, context: dict[str, Any], usage: Mapping[str, Any]) -> None:
        """Add one model call's token usage to its run's."""
        ...

    def trigger(
        self,
        agent_name: str,
        payload: Any,
        wait_for_response: bool = True,
        timeout_seconds: int = 60,
    ) -> dict[str, Any]:
        """trigger_agent from a tool call or from user code."""
        ...

    def trigger_at(
        self, agent_name: str, payload: Any, delay: Any = None, unix_timestamp: Any = None
    ) -> dict[str, Any]:
        """trigger_agent_at from a tool call or from user code."""
        ...

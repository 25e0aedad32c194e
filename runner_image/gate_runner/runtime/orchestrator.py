"""The runtime of one invocation: its state, one agent run from start to outcome, and the
dispatch to each agent kind. What an agent kind or a call phase does lives in its own module.
"""

from __future__ import annotations

import contextvars
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from connic import StopProcessing

from ..approvals import Approvals, AwaitingApproval
from ..guardrails import GuardrailBlocked
from ..mocks import Mocks, StrictFlags
from ..models import Model
from ..predefined import Predefined
from ..runtime_errors import AgentNotFound
from . import triggers
from .llm import run_llm_agent
from .payloads import as_payload, jsonable
from .sequential import run_sequential
from .tool_agent import run_tool_agent
from .trace import Span, Trace, error_text, timed

Frame = tuple["Trace", "Span | None", dict[str, Any]]


@dataclass
class RunOutcome:
    """What one agent run ended with, before any assertion looks at it."""

    status: str  # completed | failed | cancelled | blocked | awaiting_approval
    output: Any
    error: str | None
    run_context: dict[str, Any]


class Runtime:
    """Runs agents of one loaded project for one invocation."""

    def __init__(
        self,
        agents: Mapping[str, Any],
        *,
        loader: Any = None,
        project: Path | None = None,
        model_mode: str | None = None,
    ) -> None:
        self.agents = agents
        self.loader = loader
        self.project = project
        self.model_mode = model_mode
        # Each LLM agent's model, chosen on its first run in this invocation (llm.model_for).
        self.models: dict[str, Model] = {}
        self.predefined = Predefined()
        self.mocks = Mocks(None, StrictFlags())
        self.approvals = Approvals()
        # Strict-flag and mock-signature violations: they fail the invocation whatever the
        # run's own status says.
        self.violations: list[str] = []
        # The frames of the runs in progress. A ContextVar, not a list: children triggered
        # in parallel (asyncio.gather over trigger_agent) each run in their own thread with
        # a copy of the context, so each sees its own parent.
        self._frames: contextvars.ContextVar[tuple[Frame, ...]] = contextvars.ContextVar(
            "gate_runner_frames", default=()
        )

    def current_frame(self) -> Frame:
        """The innermost run in progress in this context: where a trigger opens its span."""
        frames = self._frames.get()
        return frames[-1] if frames else (Trace(), None, {})

    # -- entry points -----------------------------------------------------------------------

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
        context: dict[str, Any] = {
            "run_id": run_id or str(uuid.uuid4()),
            "agent_name": agent_name,
            "timestamp": datetime.now(UTC).isoformat(),
            "payload": payload,
        }
        if parent_run_id:
            context["parent_run_id"] = parent_run_id
        started = time.monotonic()
        publish = True
        token = self._frames.set((*self._frames.get(), (trace, parent, context)))
        try:
            output = self.run_agent(agent_name, payload, context, trace, parent)
            status, error = "completed", None
        except StopProcessing as stop:
            # Spec §3.1: StopProcessing ends the whole run gracefully with its message.
            output = getattr(stop, "response", str(stop))
            status, error = "completed", None
            publish = bool(getattr(stop, "publish_outbound", True))
        except AwaitingApproval:
            output, status, error = None, "awaiting_approval", None
        except GuardrailBlocked as blocked:
            # `blocked` is the assertion-level status; the stored status is kept beside it.
            output, status = blocked.message, "blocked"
            error = blocked.message if blocked.fail_run else None
            context["stored_status"] = "failed" if blocked.fail_run else "completed"
        except AgentNotFound:
            raise
        except Exception as exc:
            output, status, error = None, "failed", error_text(exc)
        finally:
            self._frames.reset(token)
        context["duration_ms"] = int((time.monotonic() - started) * 1000)
        if parent is None and status == "completed":
            # Outbound connectors would publish this run; a gate records, never delivers.
            trace.open(
                "outbound",
                "outbound",
                None,
                delivered=False,
                would_publish=publish,
                output=jsonable(output),
            )
        return RunOutcome(status=status, output=output, error=error, run_context=context)

    def trigger(
        self,
        agent_name: str,
        payload: Any,
        wait_for_response: bool = True,
        timeout_seconds: int = 60,
    ) -> dict[str, Any]:
        """trigger_agent from a tool call or from user code (triggers.trigger)."""
        return triggers.trigger(self, agent_name, payload, wait_for_response, timeout_seconds)

    def trigger_at(
        self, agent_name: str, payload: Any, delay: Any = None, unix_timestamp: Any = None
    ) -> dict[str, Any]:
        """trigger_agent_at from a tool call or from user code (triggers.trigger_at)."""
        return triggers.trigger_at(self, agent_name, payload, delay, unix_timestamp)

    # -- dispatch ---------------------------------------------------------------------------

    def run_agent(
        self,
        name: str,
        payload: Any,
        context: dict[str, Any],
        trace: Trace,
        parent: Span | None,
    ) -> Any:
        """One agent of the run (the entry agent or a sequential stage), by its kind."""
        agent = self.agents.get(name)
        if agent is None:
            raise AgentNotFound(f"agent {name!r} does not exist")
        kind = str(getattr(agent.config.type, "value", agent.config.type))
        span = trace.open("agent", name, parent, agent_type=kind)
        token = self._frames.set((*self._frames.get(), (trace, span, context)))
        try:
            with timed(span):
                if kind == "tool":
                    return run_tool_agent(self, agent, payload, context, trace, span)
                if kind == "sequential":
                    return run_sequential(self, agent, payload, context, trace, span)
                return run_llm_agent(self, agent, as_payload(payload), context, trace, span)
        finally:
            self._frames.reset(token)

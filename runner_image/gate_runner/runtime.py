"""The agent runtime: runs `tool` agents and `sequential` chains of them (spec §2.1).

LLM agents arrive with the agent-runtime issue; until then an LLM agent ends its run
``failed`` with a reason that says so, rather than pretending to run.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from connic import StopProcessing


class AgentNotFound(Exception):
    """A test or a sequential chain names an agent the project does not define."""


@dataclass
class Span:
    span_id: str
    parent_span_id: str | None
    span_order: int
    type: str
    name: str
    status: str = "ok"
    duration_ms: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "span_order": self.span_order,
            "type": self.type,
            "name": self.name,
            "status": self.status,
            "duration_ms": self.duration_ms,
            "metadata": self.metadata,
        }


class Trace:
    """Spans of one invocation, in the order they were opened."""

    def __init__(self) -> None:
        self.spans: list[Span] = []

    def open(self, type_: str, name: str, parent: Span | None, **metadata: Any) -> Span:
        span = Span(
            span_id=f"s{len(self.spans) + 1}",
            parent_span_id=parent.span_id if parent else None,
            span_order=len(self.spans) + 1,
            type=type_,
            name=name,
            metadata=dict(metadata),
        )
        self.spans.append(span)
        return span

    def tool_calls(self) -> list[Span]:
        return [s for s in self.spans if s.type == "tool_call"]


@dataclass
class RunOutcome:
    """What one agent run ended with, before any assertion looks at it."""

    status: str  # completed | failed | cancelled | blocked | awaiting_approval
    output: Any
    error: str | None
    run_context: dict[str, Any]


def jsonable(value: Any) -> Any:
    """Make a value safe for the JSON result; what JSON cannot hold is shown by repr."""
    try:
        return json.loads(json.dumps(value, default=repr))
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def stage_input(value: Any) -> dict[str, Any]:
    """The payload dict a tool agent receives for an upstream value (spec §2.1, §7.5)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return {"input": value}
        return decoded if isinstance(decoded, dict) else {"input": decoded}
    return {"input": value}


def call_user_function(func: Callable[..., Any], **kwargs: Any) -> Any:
    """Call sync or async user code and return its result."""
    result = func(**kwargs)
    if inspect.isawaitable(result):

        async def _await() -> Any:
            return await result

        return asyncio.run(_await())
    return result


class Runtime:
    """Runs agents of one loaded project."""

    def __init__(self, agents: Mapping[str, Any]) -> None:
        self.agents = agents

    def run(self, agent_name: str, payload: dict[str, Any], trace: Trace) -> RunOutcome:
        context: dict[str, Any] = {
            "run_id": str(uuid.uuid4()),
            "agent_name": agent_name,
            "timestamp": datetime.now(UTC).isoformat(),
            "payload": payload,
        }
        started = time.monotonic()
        try:
            output = self._run_agent(agent_name, payload, context, trace, None)
            status, error = "completed", None
        except StopProcessing as stop:
            # Spec §3.1: StopProcessing ends the whole run gracefully with its message.
            output = getattr(stop, "response", str(stop))
            status, error = "completed", None
        except AgentNotFound:
            raise
        except Exception as exc:
            output, status, error = None, "failed", f"{type(exc).__name__}: {exc}"
        context["duration_ms"] = int((time.monotonic() - started) * 1000)
        return RunOutcome(status=status, output=output, error=error, run_context=context)

    def _run_agent(
        self,
        name: str,
        payload: Any,
        context: dict[str, Any],
        trace: Trace,
        parent: Span | None,
    ) -> Any:
        agent = self.agents.get(name)
        if agent is None:
            raise AgentNotFound(name)
        kind = str(getattr(agent.config.type, "value", agent.config.type))
        span = trace.open("agent", name, parent, agent_type=kind)
        started = time.monotonic()
        try:
            if kind == "tool":
                return self._run_tool_agent(agent, stage_input(payload), context, trace, span)
            if kind == "sequential":
                value = payload
                for stage in agent.config.agents:
                    value = self._run_agent(stage, value, context, trace, span)
                return value
            raise NotImplementedError(
                f"agent '{name}' is of type {kind!r}; this runner version runs tool and "
                "sequential agents only"
            )
        except Exception as exc:
            span.status = "error"
            span.metadata["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            span.duration_ms = int((time.monotonic() - started) * 1000)

    def _run_tool_agent(
        self,
        agent: Any,
        payload: dict[str, Any],
        context: dict[str, Any],
        trace: Trace,
        parent: Span,
    ) -> Any:
        tool = agent.tools[0]
        func = tool.func
        kwargs: dict[str, Any] = {"payload": payload}
        if "context" in inspect.signature(func).parameters:
            kwargs["context"] = context
        span = trace.open(
            "tool_call",
            tool.name,
            parent,
            tool_ref=tool.ref or tool.name,
            tool_name=tool.name,
            params=jsonable(payload),
            mocked=False,
        )
        started = time.monotonic()
        try:
            result = call_user_function(func, **kwargs)
        except StopProcessing:
            span.metadata["stopped"] = True
            raise
        except Exception as exc:
            span.status = "error"
            span.metadata["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            span.duration_ms = int((time.monotonic() - started) * 1000)
        span.metadata["result"] = jsonable(result)
        return result

"""Tool agents: one custom tool that receives the payload (spec 2.1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .operation import operation
from .payloads import jsonable, stage_input
from .tool_calls import call_custom_tool
from .trace import Span, Trace, timed

if TYPE_CHECKING:
    from .orchestrator import Runtime


def run_tool_agent(
    rt: Runtime,
    agent: Any,
    payload: Any,
    context: dict[str, Any],
    trace: Trace,
    span: Span,
) -> Any:
    return operation(
        rt,
        agent,
        payload,
        context,
        trace,
        span,
        lambda: _call_tool(rt, agent, stage_input(payload), context, trace, span),
    )


def _call_tool(
    rt: Runtime,
    agent: Any,
    payload: dict[str, Any],
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
) -> Any:
    tool = agent.tools[0]
    span = trace.open(
        "tool_call",
        tool.name,
        parent,
        tool_ref=tool.ref or tool.name,
        tool_name=tool.name,
        params=jsonable(payload),
        mocked=False,
    )
    with timed(span):
        result = call_custom_tool(rt, tool, {"payload": payload}, context, span)
    span.metadata["result"] = jsonable(result)
    return result

"""Tool agents: one custom tool that receives the payload (spec 2.1)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from .operation import operation
from .payloads import jsonable, stage_input
from .sdk import abort_tool
from .tool_calls import aborted, after_hook, before_hook, call_custom_tool, hooks_of
from .trace import Span, Trace, timed

if TYPE_CHECKING:
    from .port import RuntimePort


def run_tool_agent(
    rt: RuntimePort,
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
        lambda value: _call_tool(rt, agent, stage_input(value), context, trace, span),
    )


def _call_tool(
    rt: RuntimePort,
    agent: Any,
    payload: dict[str, Any],
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
) -> Any:
    """The body tool, called as `func(payload=...)`, with the agent's tool hooks around it.

    Decided (issue 19, item 11): hooks run around a tool agent's own tool too (SDK
    ToolHook: "Hook functions that run before and after tool execution for an agent"; no
    agent kind is excluded). They see the call's params, `{"payload": ...}`; AbortTool's
    result becomes the output, and any other exception fails the attempt (there is no model
    to hand it to).
    """
    tool = agent.tools[0]
    ref = tool.ref or tool.name
    span = trace.open(
        "tool_call",
        tool.name,
        parent,
        tool_ref=ref,
        tool_name=tool.name,
        params=jsonable(payload),
        mocked=False,
    )
    hooks = hooks_of(rt, agent.config.name)
    params: dict[str, Any] = {"payload": payload}
    try:
        original = copy.deepcopy(params)
    except Exception:  # a builder's payload may hold what cannot be copied
        original = dict(params)
    with timed(span):
        try:
            params = before_hook(rt, hooks, ref, tool.name, params, context, trace, span)
        except abort_tool() as exc:
            return aborted(span, getattr(exc, "result", str(exc)))
        # Assertions see the payload as the tool's params (spec 2.1: keys never spread).
        span.metadata["params"] = jsonable(params.get("payload"))
        result = call_custom_tool(rt, tool, params, context, span)
        result = after_hook(rt, hooks, ref, tool.name, original, result, context, trace, span)
    span.metadata["result"] = jsonable(result)
    return result

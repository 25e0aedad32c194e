"""One tool call from an LLM agent, phase by phase: the approval gate (spec 8.5), the
`before` hook, the tool itself (predefined, mocked or real), the `after` hook.

Errors go back to the model as text; only what ends the run (StopProcessing, a strict
violation, a pending or failing approval) propagates.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..approvals import AwaitingApproval, rejection_error, requires_approval
from ..expr import describe
from ..mocks import StrictViolation, check_arguments, normalise
from ..runtime_errors import AgentRunError
from .mocking import guard, resolve_phase, violate
from .payloads import jsonable
from .sdk import abort_tool, stop_processing
from .toolset import approval_inputs, discoverable, is_api_tool, tool_schemas
from .trace import Span, Trace, error_text, timed
from .usercode import accepts, call_user_function

if TYPE_CHECKING:
    from .port import RuntimePort


class ApprovalRejected(AgentRunError):
    """A rejected (or timed-out) approval with on_rejection: fail ends the run failed."""


def hooks_of(rt: RuntimePort, name: str) -> Any:
    """The agent's `hooks/<agent>.py` as the SDK loads it, or None."""
    if rt.loader is None:
        return None
    return rt.loader.load_tool_hooks(name)


def run_tool_call(
    rt: RuntimePort,
    agent: Any,
    tools: Mapping[str, Any],
    name: str,
    arguments: dict[str, Any],
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
) -> Any:
    """One tool call with hooks around it; errors go back to the model as text."""
    rt.check_deadline()
    tool = tools.get(name)
    ref = (tool.ref or tool.name) if tool is not None else name
    span = trace.open(
        "tool_call",
        name,
        parent,
        tool_ref=ref,
        tool_name=name,
        params=jsonable(arguments),
        mocked=False,
    )
    started = time.monotonic()
    hooks = hooks_of(rt, agent.config.name)
    params = dict(arguments)
    original = jsonable(arguments)  # what `after` receives, whatever `before` does to params
    reached_tool = False
    try:
        if tool is None and name in approval_inputs(agent):
            return ask_for_input(rt, agent, name, arguments, trace, span)
        if tool is None:
            # Hidden by its condition or never declared: the model asked, nothing ran.
            span.metadata.update(executed=False, not_executed="unknown or hidden tool")
            raise AgentRunError(f"unknown tool {name!r}")
        if tool.is_predefined and tool.name == "search_tools":
            answer = search_discoverable(rt, agent, arguments, context)
            span.metadata["result"] = jsonable(answer)
            return answer
        if tool.is_predefined and tool.name == "use_tool":
            found = use_discoverable(rt, agent, arguments, context, span)
            if not isinstance(found, tuple):
                return found  # it named no discoverable tool: the model is told so
            # From here on the call is the discoverable tool's own, through the path of a
            # listed tool: approval, hooks, mocks, strict flags; the span's `discovered` is
            # what every tool assertion reads.
            tool, params = found
            name, ref = tool.name, tool.ref or tool.name
            original = jsonable(params)
        refused = approval(rt, agent, tool, ref, name, params, context, trace, span)
        if refused is not None:
            span.status = "error"
            span.metadata.update(
                executed=False, not_executed="refused by approval", result=jsonable(refused)
            )
            return refused
        from .mcp import call as call_mcp
        from .mcp_tools import McpTool

        if isinstance(tool, McpTool):
            # No agent hook fires for an MCP tool (spec 4.2), and so no hook mock.
            result = call_mcp(rt, agent.config.name, tool, params, context, span)
            span.metadata["result"] = jsonable(result)
            return result
        try:
            params = before_hook(rt, hooks, ref, name, params, context, trace, span)
        except (stop_processing(), StrictViolation, AwaitingApproval, ApprovalRejected):
            raise
        except Exception as exc:
            # AbortTool or any other exception: the hook stopped the call before the tool
            # received it, so both are an aborted call (issue 10, rule 4).
            if isinstance(exc, abort_tool()):
                result = getattr(exc, "result", str(exc))
            else:
                result = {"error": f"the before hook raised {error_text(exc)}"}
            return aborted(span, result)
        reached_tool = True
        result = execute_tool(rt, tool, params, context, span, agent.config.name)
        result = after_hook(rt, hooks, ref, name, original, result, context, trace, span)
        span.metadata["result"] = jsonable(result)
        return result
    except (stop_processing(), StrictViolation, AwaitingApproval, ApprovalRejected) as stop:
        span.metadata["stopped"] = True
        if not reached_tool:
            # The model called it, and the run stopped before the tool received the call.
            whys: dict[type[BaseException], str] = {
                ApprovalRejected: "refused by approval",
                AwaitingApproval: "awaiting approval",
                StrictViolation: "stopped by a strict flag",
            }
            why = whys.get(type(stop), "stopped by a hook")
            span.metadata.setdefault("executed", False)
            span.metadata.setdefault("not_executed", why)
        raise
    except Exception as exc:
        span.status = "error"
        message = error_text(exc)
        span.metadata["error"] = message
        return {"error": message}
    finally:
        span.duration_ms = int((time.monotonic() - started) * 1000)


def before_hook(
    rt: RuntimePort,
    hooks: Any,
    ref: str,
    name: str,
    params: dict[str, Any],
    context: dict[str, Any],
    trace: Trace,
    span: Span,
) -> dict[str, Any]:
    """The params after the agent's `before` hook (or its mock): a returned dict is merged
    in, None keeps them. Whatever the hook raises, AbortTool included, is the caller's."""
    before = resolve_phase(rt, "hook", hooks.before if hooks else None, ref, "before")
    if before is None:
        return params
    changed = call_hook(before, name, params, context, trace=trace, parent=span, phase="before")
    if isinstance(changed, dict):
        params = {**params, **changed}
    span.metadata["params"] = jsonable(params)
    if "discovered" in span.metadata:
        # A call through use_tool: assertions read `discovered`, and its params are what the
        # tool received, after the hook, as for a listed tool (issue 39; SDK test_schema.py:
        # "with that tool's parameters and result").
        span.metadata["discovered"]["params"] = jsonable(params)
    return params


def after_hook(
    rt: RuntimePort,
    hooks: Any,
    ref: str,
    name: str,
    original: dict[str, Any],
    result: Any,
    context: dict[str, Any],
    trace: Trace,
    span: Span,
) -> Any:
    """The result after the agent's `after` hook (or its mock): non-None replaces it.

    Decided (issue 19, item 11): `after` receives the original params, the ones the call
    was made with before `before` changed them (SDK ToolHook: "The 'after' hook receives the
    tool name, the original params, the tool's result").
    """
    after = resolve_phase(rt, "hook", hooks.after if hooks else None, ref, "after")
    if after is None:
        return result
    replaced = call_hook(
        after, name, original, context, result=result, trace=trace, parent=span, phase="after"
    )
    return result if replaced is None else replaced


def aborted(span: Span, result: Any) -> Any:
    """Record that a before hook stopped the call before the tool received it; ``result``
    is what the caller gets instead."""
    span.status = "error"
    span.metadata.update(
        aborted=True, executed=False, not_executed="aborted by hook", result=jsonable(result)
    )
    return result


def call_hook(
    func: Callable[..., Any],
    name: str,
    params: dict[str, Any],
    context: dict[str, Any],
    **extra: Any,
) -> Any:
    args: list[Any] = [name, params]
    if "result" in extra:
        args.append(extra["result"])
    if accepts(func, "context") or len(inspect.signature(func).parameters) > len(args):
        args.append(context)
    trace, parent = extra["trace"], extra["parent"]
    with timed(trace.open("hook", f"hook.{extra['phase']}", parent, tool_name=name)):
        return call_user_function(func, *args)


def execute_tool(
    rt: RuntimePort,
    tool: Any,
    params: dict[str, Any],
    context: dict[str, Any],
    span: Span,
    agent: str = "",
) -> Any:
    """``agent``: whose call it is (a chain's stages share their run's context), so that its
    recordings serve it in replay mode."""
    if is_api_tool(tool):
        from .mcp import call_api_tool  # here: only api: tools call through it

        # Never mocked (spec 8.2), and never under strict_mocks: it runs through the gateway,
        # from the recordings in replay mode.
        return call_api_tool(rt, agent or str(context.get("agent_name") or ""), tool.ref, params)
    if tool.is_predefined:
        if tool.name == "trigger_agent":
            return rt.trigger(**params)
        if tool.name == "trigger_agent_at":
            return rt.trigger_at(**params)
        implementation = rt.predefined.get(tool.name)
        if implementation is None:
            raise AgentRunError(f"predefined tool {tool.name!r} is not available in a gate")
        return implementation(**params)
    return call_custom_tool(rt, tool, params, context, span)


def approval(
    rt: RuntimePort,
    agent: Any,
    tool: Any,
    ref: str,
    name: str,
    params: dict[str, Any],
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
) -> Any:
    """None to go on with the call; else what the model is told instead (a rejection)."""
    if not requires_approval(agent, ref, name, params, context):
        return None
    skipped: list[str] = []
    decision = rt.approvals.answer(ref, name, params, skipped)
    span = trace.open(
        "approval",
        ref,
        parent,
        params=jsonable(params),
        decision=decision.decision if decision else None,
    )
    if skipped:
        span.metadata["skipped"] = skipped  # why decisions for this tool did not answer it
    if decision is None:
        span.status = "error"
        if rt.approvals.strict:
            violate(
                rt,
                f"strict_approval_decisions: no approval_decisions entry answered "
                f"the approval of {ref} with params {jsonable(params)}",
            )
        raise AwaitingApproval(f"waiting for approval of {ref}")
    if decision.decision == "approve":
        return None
    span.status = "error"
    on_rejection = getattr(agent.config.approval, "on_rejection", "fail")
    if on_rejection == "continue":
        return {"error": str(rejection_error(decision, ref))}
    raise ApprovalRejected(str(rejection_error(decision, ref)))


def use_discoverable(
    rt: RuntimePort, agent: Any, arguments: Mapping[str, Any], context: dict[str, Any], span: Span
) -> tuple[Any, dict[str, Any]] | dict[str, Any]:
    """`use_tool(tool_name, arguments)`: the discoverable tool it names (by name or
    canonical ref) and the arguments for it; or the error the model gets when it names
    none. The span records the call as ``discovered`` (name, ref, params), which every tool
    assertion reads as that tool's own call (SDK test_schema.py: "Discoverable calls use the
    actual tool name or canonical ref in every tool assertion")."""
    wanted = arguments.get("tool_name")
    # Only those whose condition holds for this run, as for listed tools.
    usable = discoverable(rt, agent, context)
    found = next((t for t in usable if wanted in (t.name, t.ref)), None)
    if found is None:
        span.status = "error"
        span.metadata.update(executed=False, not_executed="use_tool named no discoverable tool")
        known = ", ".join(sorted(t.name for t in usable)) or "none"
        return {
            "error": f"use_tool: {wanted!r} is not one of this agent's discoverable tools "
            f"(search_tools finds them; they are: {known})"
        }
    inner = arguments.get("arguments")
    params = dict(inner) if isinstance(inner, Mapping) else {}
    span.metadata["discovered"] = {
        "tool_name": found.name,
        "tool_ref": found.ref or found.name,
        "params": jsonable(params),
    }
    return found, params


# At most this many tools one search_tools call answers with.
MAX_FOUND = 10
WORD = re.compile(r"[a-z0-9]+")


def search_discoverable(
    rt: RuntimePort, agent: Any, arguments: Mapping[str, Any], context: dict[str, Any]
) -> dict[str, Any]:
    """`search_tools(query)`: the agent's discoverable tools whose name, ref or description
    shares a word with the query, most shared words first (then by name), at most
    ``MAX_FOUND``; an empty query lists them all. Each comes with its schema, so the model can
    call it through use_tool. Decided: the platform documents a natural-language query and no
    ranking; a gate ranks by shared words, which is predictable."""
    query = set(WORD.findall(str(arguments.get("query") or "").lower()))
    scored = []
    for tool in discoverable(rt, agent, context):
        text = f"{tool.name} {tool.ref or ''} {tool.description or ''}".lower().replace("_", " ")
        shared = len(query & set(WORD.findall(text))) if query else 1
        if shared:
            scored.append((-shared, tool.name, tool))
    scored.sort(key=lambda item: (item[0], item[1]))
    found = [tool_schemas(rt, {t.name: t})[0]["function"] for _, _, t in scored[:MAX_FOUND]]
    return {"tools": found, "count": len(found)}


SENSITIVE = "[sensitive]"


def ask_for_input(
    rt: RuntimePort, agent: Any, name: str, params: dict[str, Any], trace: Trace, span: Span
) -> Any:
    """An approval input (SDK ApprovalInput, spec 8.5): a generated tool whose result is
    the text a person types. The run pauses until it is answered: an `approve` decision's
    `response` is the answer; `reject` and `timeout` follow `approval.on_rejection` as for
    a gated tool. Unanswered, the run ends awaiting approval. It has no implementation, so
    no hook or mock applies; a `sensitive` answer reaches the model and stays out of the
    trace (SDK: "Protect the response in storage and logs").
    """
    spec = approval_inputs(agent)[name]
    label = f'the input request {name} ("{spec.label}") with params {describe(jsonable(params))}'
    span.metadata.update(approval_input=True, label=spec.label)
    skipped: list[str] = []
    decision = rt.approvals.answer(name, name, params, skipped)
    request = trace.open(
        "approval",
        name,
        span,
        params=jsonable(params),
        input=True,
        decision=decision.decision if decision else None,
    )
    if skipped:
        request.metadata["skipped"] = skipped
    if decision is not None and decision.decision == "approve" and decision.response is None:
        rt.approvals.problem(
            f"approval_decisions: the approve decision for the input {name} has no response; "
            "an input is answered with the text in `response`"
        )
        decision = None
    if decision is None:
        request.status = "error"
        if rt.approvals.strict:
            violate(rt, f"strict_approval_decisions: no approval_decisions entry answered {label}")
        raise AwaitingApproval(f"waiting for {label}")
    if decision.decision == "approve":
        span.metadata["result"] = SENSITIVE if spec.sensitive else decision.response
        return decision.response
    request.status = "error"
    rejected = rejection_error(decision, name, "input")
    if getattr(agent.config.approval, "on_rejection", "fail") == "continue":
        span.metadata.update(executed=False, not_executed="refused by approval")
        return {"error": str(rejected)}
    raise ApprovalRejected(str(rejected))


def call_custom_tool(
    rt: RuntimePort, tool: Any, params: dict[str, Any], context: dict[str, Any], span: Span
) -> Any:
    """A custom file tool, or its mock: mocks replace the call, strict_mocks forbid it."""
    ref = tool.ref or tool.name
    mock = rt.mocks.tool(ref)
    if mock is not None:
        guard(rt, lambda: check_arguments(tool.func, params, ref))
        span.metadata["mocked"] = True
        return call_user_function(mock, ref, params, context)
    if rt.mocks.strict.tools:
        violate(
            rt,
            f"strict_mocks: {ref} would run for real; no mock in the mocks module matches "
            f"it (most specific first: mock_{'_'.join(normalise(ref))})",
        )
    kwargs = dict(params)
    if accepts(tool.func, "context"):
        kwargs["context"] = context
    return call_user_function(tool.func, **kwargs)

"""LLM agents: input guardrails and middleware around the model loop, then output
guardrails (spec 2.2, 4.1); the loop asks the model, runs the tool calls it makes and
hands their results back until it answers or `max_iterations` is reached.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..models import Model, ModelReply
from ..runtime_errors import AgentRunError, ModelCallError
from .guardrails import guard_input, guard_output
from .mcp import connect as connect_mcp
from .middleware import call_middleware, middleware_of
from .mocking import resolve_phase
from .model_choice import model_for
from .model_request import record_request, sensitive_inputs
from .output_schema import final_output, response_format
from .payloads import content_to_message, jsonable, user_content
from .sessions import compress, compression_of, is_context_window_error, session_key
from .tool_calls import run_tool_call
from .toolset import approval_inputs, input_schema, tool_schemas, visible_tools
from .trace import Span, Trace, timed

if TYPE_CHECKING:
    from .port import RuntimePort

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def render_prompt(template: str, context: Mapping[str, Any]) -> str:
    """`{var}` from the run context; placeholders with no match stay as written (spec §2.2)."""

    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        return str(context[key]) if key in context else match.group(0)

    return PLACEHOLDER.sub(sub, template)


def run_llm_agent(
    rt: RuntimePort,
    agent: Any,
    payload: dict[str, Any],
    context: dict[str, Any],
    trace: Trace,
    span: Span,
) -> Any:
    config = agent.config
    middleware = middleware_of(rt, config.name)
    content = guard_input(rt, config, middleware, user_content(payload), context, trace, span)
    before = resolve_phase(
        rt, "middleware", middleware.before if middleware else None, config.name, "before"
    )
    if before is not None:
        content = call_middleware("before", before, content, context, trace, span)
        if not isinstance(content, dict):
            raise AgentRunError(
                f"middleware before() for {config.name!r} must return the content dict, "
                f"got {type(content).__name__}"
            )
    output = llm_loop(rt, agent, content, context, trace, span)
    after = resolve_phase(
        rt, "middleware", middleware.after if middleware else None, config.name, "after"
    )
    if after is not None:
        rt.execution_finished(context)  # `after` sees duration_ms and token_usage (spec 4.4)
        output = call_middleware("after", after, output, context, trace, span)
        if output is None:
            raise AgentRunError(
                f"middleware after() for {config.name!r} returned None; it must return the response"
            )
    return guard_output(rt, config, output, context, trace, span)


def llm_loop(
    rt: RuntimePort,
    agent: Any,
    content: dict[str, Any],
    context: dict[str, Any],
    trace: Trace,
    span: Span,
) -> Any:
    config = agent.config
    model = model_for(rt, config.name)
    tools = {t.name: t for t in visible_tools(agent, context)}
    servers = rt.mcp_tools[(id(context), config.name)] = connect_mcp(
        rt, agent, context, trace, span
    )
    for name, tool in servers.listed.items():
        tools.setdefault(name, tool)  # a listed tool of the agent's own keeps its name
    schemas = tool_schemas(rt, tools)
    schemas += [input_schema(name, spec) for name, spec in approval_inputs(agent).items()]
    # A session agent's run continues the history of its session in this invocation.
    key = session_key(config, context)
    history = list(rt.sessions.get(key, [])) if key is not None else []
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": render_prompt(config.system_prompt or "", context)},
        *history,
        content_to_message(content),
    ]
    span.metadata.update(model=config.model, model_mode=model.mode)
    if key is not None:
        span.metadata["session"] = {"key": key[1] or None, "history_messages": len(history)}
    compression = compression_of(config)
    last_prompt = 0
    for iteration in range(config.max_iterations):
        rt.check_deadline()
        limit = compression.max_prompt_tokens if compression is not None else None
        if limit and last_prompt > limit:
            why = f"the last prompt took {last_prompt} tokens, over max_prompt_tokens ({limit})"
            shorter = compress(rt, model, config, compression, messages, why, context, trace, span)
            messages = shorter if shorter is not None else messages
        try:
            reply = call_model(model, config, messages, schemas, context, trace, span, iteration)
        except Exception as exc:
            if compression is None or not is_context_window_error(exc):
                raise
            why = "the provider refused the prompt for its context window"
            shorter = compress(rt, model, config, compression, messages, why, context, trace, span)
            if shorter is None:
                raise
            # The one repair request, separate from the retry budget (SDK RetryOptions).
            messages = shorter
            reply = call_model(model, config, messages, schemas, context, trace, span, iteration)
        last_prompt = int(reply.usage.get("prompt_tokens", 0) or 0)
        rt.count_tokens(context, reply.usage)
        if not reply.tool_calls:
            output = final_output(agent, reply.content or "")
            if key is not None:
                answer = {"role": "assistant", "content": reply.content}
                rt.sessions[key] = [*messages[1:], answer]
            return output
        messages.append(
            {
                "role": "assistant",
                "content": reply.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in reply.tool_calls
                ],
            }
        )
        for call in reply.tool_calls:
            result = run_tool_call(
                rt, agent, tools, call.name, call.arguments, context, trace, span
            )
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.name,
                    "content": result if isinstance(result, str) else json.dumps(jsonable(result)),
                }
            )
    raise AgentRunError(f"max_iterations ({config.max_iterations}) reached without a final answer")


# A failed primary request the fallback cannot help: the same budget, deadline or channel
# would refuse it too.
NO_FALLBACK_KINDS = frozenset({"budget", "deadline", "refused"})


def model_options(config: Any) -> dict[str, Any]:
    """The reasoning options the agent set (``auto``, the default, is none): what the model
    is called with besides its temperature."""
    options: dict[str, Any] = {}
    effort = getattr(config, "reasoning_effort", None)
    if effort and effort != "auto":
        options["reasoning_effort"] = str(effort)
    budget = getattr(config, "reasoning_budget", None)
    if budget:
        options["reasoning_budget"] = int(budget)
    return options


def call_model(
    model: Model,
    config: Any,
    messages: list[dict[str, Any]],
    schemas: list[dict[str, Any]],
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
    iteration: int,
) -> ModelReply:
    """One model request of the loop. With a ``fallback_model`` (SDK RetryOptions.attempts):
    the primary is tried once; once a request of it fails, the fallback gets the retry
    budget, for this request and the rest of the run, and the run's context holds
    ``fallback_model_used``. Decided: the run stays with the fallback once switched."""
    fallback = getattr(config, "fallback_model", None)
    if fallback and not context.get("fallback_model_used"):
        try:
            return _ask(model, config, config.model or "", 1, messages, schemas, context, trace,
                        parent, iteration)  # fmt: skip
        except ModelCallError as exc:
            if exc.span_metadata.get("error_kind") in NO_FALLBACK_KINDS:
                raise
            if compression_of(config) is not None and is_context_window_error(exc):
                raise  # compression repairs the prompt first (llm_loop)
        except Exception as exc:
            # Any other failed request (a script that raised, a reply that was no completion,
            # a recording not found) is the fallback's turn.
            if compression_of(config) is not None and is_context_window_error(exc):
                raise
        context["fallback_model_used"] = fallback
    name = context.get("fallback_model_used") or config.model or ""
    return _ask(model, config, str(name), None, messages, schemas, context, trace, parent,
                iteration)  # fmt: skip


def _ask(
    model: Model,
    config: Any,
    name: str,
    attempts: int | None,
    messages: list[dict[str, Any]],
    schemas: list[dict[str, Any]],
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
    iteration: int,
) -> ModelReply:
    options = model_options(config)
    span = trace.open(
        "model_call",
        name or "model",
        parent,
        iteration=iteration,
        mode=model.mode,
        model=name,  # the model that was asked: the fallback's name once switched
        temperature=config.temperature,
        **({"fallback": True} if name != (config.model or "") else {}),
        **options,
    )
    # Every request of the loop may end the run, tools offered or not: each carries the
    # output_schema (docs/live-models.md, structured output).
    answer_format = response_format(config)
    # Recorded before the call: a failed request shows what was asked too.
    record_request(trace, span, messages, schemas, answer_format, sensitive_inputs(config))
    try:
        with timed(span):
            reply = model.complete(
                model=name,
                messages=messages,
                tools=schemas,
                temperature=config.temperature,
                context=context,
                options=options,
                attempts=attempts,
                response_format=answer_format,
            )
    except ModelCallError as exc:
        span.metadata.update(exc.span_metadata)  # why it failed: e.g. which budget, how much
        raise
    span.metadata.update(
        reply.span_metadata,
        content=reply.content,
        tool_calls=[{"name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
    )
    return reply

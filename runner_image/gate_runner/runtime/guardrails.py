"""Running an LLM agent's guardrails on its input or output: spans for each rule, and the
custom rules' code (or its mock). The rules themselves live in gate_runner/guardrails.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..guardrails import GuardrailBlocked, Moderate, run_rules
from .middleware import call_middleware
from .mocking import resolve_phase, violate
from .model_choice import model_for
from .payloads import jsonable
from .trace import Span, Trace
from .usercode import call_user_function

if TYPE_CHECKING:
    from .orchestrator import Runtime


def run_guardrails(
    rt: Runtime,
    agent: str,
    rules: list[Any],
    direction: str,
    text: str,
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
) -> str:
    def record(name: str, where: str, status: str, message: str | None, ms: int) -> None:
        # The span open() returns: with parallel children, spans[-1] may be another thread's.
        span = trace.open("guardrail", name, parent, direction=where, message=message)
        span.status = status
        span.duration_ms = ms

    def custom(name: str) -> Callable[..., Any] | None:
        # The real file must still import cleanly, mocked or not (spec 8.2).
        found = rt.loader.load_guardrail(name) if rt.loader is not None else None
        if found is None:
            return None
        mock = rt.mocks.guardrail(direction, name)
        if mock is not None:
            return mock
        if rt.mocks.strict.guardrails:
            violate(
                rt,
                f"strict_guardrail_mocks: the real custom guardrail {name!r} would run "
                f"({direction}); the mocks module has no replacement for it",
            )
        check: Callable[..., Any] = found.check
        return check

    # The agent's own model mode decides: its gateway (live, record) or its recordings
    # (replay); a scripted model calls no provider, so the rule is skipped. Scripted mode
    # chooses no model at all: a tool agent has no scripted model to find.
    moderate: Moderate | None = None
    if rt.model_mode != "scripted" and any(r.type == "moderation" for r in rules):
        moderate = getattr(model_for(rt, agent), "moderate", None)
    return run_rules(
        rules,
        direction,
        text,
        context,
        custom=custom,
        call=call_user_function,
        record=record,
        moderate=moderate,
    )


def guard_input(
    rt: Runtime,
    config: Any,
    middleware: Any,
    content: dict[str, Any],
    context: dict[str, Any],
    trace: Trace,
    span: Span,
) -> dict[str, Any]:
    """The agent's input guardrails on the content's text, before `before` (spec 4.1).

    Returns the content, redacted where a rule redacted it. On a block the agent never runs
    and `after` still sees the rejection message (unless `run_after_on_block: false`).
    Decided (issue 19, item 11): every agent kind has them, not only LLM agents (SDK
    AgentConfig.guardrails: "Guardrails run before/after agent execution"; no kind is
    excluded, as approval.inputs or context_compression are).
    """
    rails = config.guardrails
    if rails is None or not rails.input:
        return content
    raw_text = "\n".join(str(p["text"]) for p in content["parts"] if "text" in p)
    try:
        redacted = run_guardrails(
            rt, config.name, rails.input, "input", raw_text, context, trace, span
        )
    except GuardrailBlocked as blocked:
        after = (
            resolve_phase(
                rt, "middleware", middleware.after if middleware else None, config.name, "after"
            )
            if rails.run_after_on_block  # first: a phase that will not run is not due
            else None
        )
        if after is not None:
            rt.execution_finished(context)
            blocked.message = call_middleware("after", after, blocked.message, context, trace, span)
        raise
    if redacted == raw_text:
        return content
    return {
        **content,
        "parts": [{"text": redacted}] + [p for p in content["parts"] if "text" not in p],
    }


def guard_output(
    rt: Runtime, config: Any, output: Any, context: dict[str, Any], trace: Trace, span: Span
) -> Any:
    """The agent's output guardrails on its output as text, after `after` (spec 4.1); a
    redacted structured output keeps its structure when the redacted text is still JSON."""
    rails = config.guardrails
    if rails is None or not rails.output:
        return output
    text = output if isinstance(output, str) else json.dumps(jsonable(output))
    checked = run_guardrails(rt, config.name, rails.output, "output", text, context, trace, span)
    if checked == text:
        return output
    if isinstance(output, str):
        return checked
    try:
        return json.loads(checked)
    except ValueError:
        return checked

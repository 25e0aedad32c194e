"""Running an LLM agent's guardrails on its input or output: spans for each rule, and the
custom rules' code (or its mock). The rules themselves live in gate_runner/guardrails.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..guardrails import NO_JUDGE, GuardrailBlocked, Judged, Judging, Moderate, run_rules
from ..judge import JUDGED_TYPES, VERDICT_FORMAT, judge_messages, parse_verdict
from .middleware import call_middleware
from .mocking import resolve_phase, violate
from .model_choice import model_for
from .payloads import jsonable
from .trace import Span, Trace
from .usercode import call_user_function

if TYPE_CHECKING:
    from .port import RuntimePort


def run_guardrails(
    rt: RuntimePort,
    agent: str,
    rules: list[Any],
    direction: str,
    text: str,
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
) -> str:
    def record(
        name: str, where: str, status: str, message: str | None, ms: int, extra: dict[str, Any]
    ) -> None:
        # The span open() returns: with parallel children, spans[-1] may be another thread's.
        span = trace.open("guardrail", name, parent, direction=where, message=message, **extra)
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
        judging=judging(rt, agent, rules, context),
    )


def judging(rt: RuntimePort, agent: str, rules: list[Any], context: dict[str, Any]) -> Judging:
    """How this agent's judged guardrails (judge.py) are checked: by the rule's own ``model``
    or else the project's guardrail model, asked through the agent's own model (its gateway
    in live and record mode, its recordings in replay). Skipped in scripted mode, which
    calls no provider, and when no judge model is named."""
    if not any(r.type in JUDGED_TYPES for r in rules):
        return NO_JUDGE
    config = rt.agents.get(agent)
    facts = {
        "system_prompt": str(getattr(config, "system_prompt", None) or ""),
        "request": _request_text(context.get("payload")),
    }

    def ask(kind: str, rule_config: Mapping[str, Any], text: str) -> Judged | str:
        name = str(rule_config.get("model") or rt.guardrail_model or "")
        if not name:
            return NO_JUDGE.unavailable
        if rt.model_mode == "scripted":
            return "it needs a judge model, and scripted mode calls none"
        model = model_for(rt, agent)  # chosen here: a run with no judged rule needs none
        if model.mode not in ("live", "record", "replay"):
            return f"it needs a judge model, and {model.mode} mode calls none"
        reply = model.complete(
            model=name,
            messages=judge_messages(kind, rule_config, text, facts),
            tools=[],
            temperature=0.0,
            context=context,
            options={},
            response_format=VERDICT_FORMAT,
        )
        verdict = parse_verdict(kind, name, reply.content)
        # What the judge's call was, as a model span shows it (tokens, cost, request hash).
        return verdict, {"judge_model": name, **reply.span_metadata}

    return Judging(ask)


def _request_text(payload: Any) -> str:
    """The run's input as text, for the relevance judge: a payload's text parts, else JSON."""
    if isinstance(payload, Mapping) and isinstance(payload.get("parts"), list):
        texts = [str(p["text"]) for p in payload["parts"] if isinstance(p, Mapping) and "text" in p]
        if texts:
            return "\n".join(texts)
    return payload if isinstance(payload, str) else json.dumps(jsonable(payload))


def guard_input(
    rt: RuntimePort,
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
    rt: RuntimePort, config: Any, output: Any, context: dict[str, Any], trace: Trace, span: Span
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

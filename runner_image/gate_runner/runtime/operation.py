"""What tool and sequential agents share: middleware around retried attempts (spec 4.1)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..runtime_errors import AgentRunError
from .guardrails import guard_input, guard_output
from .middleware import call_middleware, middleware_of
from .mocking import resolve_phase
from .payloads import as_payload, jsonable, user_content
from .retries import operation_attempts
from .sdk import stop_processing
from .trace import Span, Trace

if TYPE_CHECKING:
    from .port import RuntimePort


def operation(
    rt: RuntimePort,
    agent: Any,
    payload: Any,
    context: dict[str, Any],
    trace: Trace,
    span: Span,
    body: Callable[[Any], Any],
) -> Any:
    """A tool or sequential agent's run: guardrails and middleware around retried attempts
    (spec 4.1), in the order input guardrails, `before`, the body, `after`, output
    guardrails.

    `before` runs once, or before every attempt with `rerun_middleware: true` (with
    `context["retry_attempt"]`); its content must come back but does not feed the tool,
    which gets the payload (redacted where an input guardrail redacted its text). `after`
    runs once, on the output as text.
    """
    name = agent.config.name
    middleware = middleware_of(rt, name)
    read = user_content(as_payload(payload))
    content = guard_input(rt, agent.config, middleware, read, context, trace, span)
    if content is not read:
        payload = redacted_payload(payload, str(content["parts"][0]["text"]))
    before = resolve_phase(
        rt, "middleware", middleware.before if middleware else None, name, "before"
    )
    after = resolve_phase(rt, "middleware", middleware.after if middleware else None, name, "after")
    retry = getattr(agent.config, "retry_options", None)
    rerun = bool(getattr(retry, "rerun_middleware", False))

    def attempt(number: int) -> Any:
        if before is not None and (number == 1 or rerun):
            if rerun:
                context["retry_attempt"] = number - 1
            returned = call_middleware("before", before, content, context, trace, span)
            if not isinstance(returned, dict):
                raise AgentRunError(
                    f"middleware before() for {name!r} must return the content dict, "
                    f"got {type(returned).__name__}"
                )
        return body(payload)

    output = with_retries(agent, span, attempt)
    if after is not None:
        text = output if isinstance(output, str) else json.dumps(jsonable(output))
        rt.execution_finished(context)  # `after` sees duration_ms and token_usage (spec 4.4)
        output = call_middleware("after", after, text, context, trace, span)
    return guard_output(rt, agent.config, output, context, trace, span)


def redacted_payload(payload: Any, text: str) -> Any:
    """``payload`` with an input guardrail's redacted ``text`` in place of the text it read.

    The text is what `user_content` made of the payload: its `message` alone, or its other
    keys as JSON (which a redaction of PII values leaves JSON); `files` are kept.
    """
    shaped = as_payload(payload)
    rest = {k: v for k, v in shaped.items() if k != "files"}
    if set(rest) == {"message"}:
        new: dict[str, Any] = {**shaped, "message": text}
    else:
        try:
            decoded = json.loads(text)
        except ValueError:
            raise AgentRunError(
                "an input guardrail's redaction left the payload's text unreadable as JSON"
            ) from None
        new = {**decoded, **({"files": shaped["files"]} if "files" in shaped else {})}
    if isinstance(payload, dict):
        return new
    if isinstance(payload, str):
        return new["message"] if set(rest) == {"message"} else json.dumps(new)
    return new.get("input", new)


def with_retries(agent: Any, span: Span, attempt: Callable[[int], Any]) -> Any:
    """retry_options for tool and sequential agents: operation attempts, the first
    included (spec 2.2), with ``initial_delay`` doubling up to ``max_delay`` between them.

    Without retry_options an operation gets one attempt, no retry and no wait (decided,
    issue 39: the one rule, in retries.py, where a model request gets 3)."""
    retry = getattr(agent.config, "retry_options", None)
    attempts = operation_attempts(agent.config)
    initial = float(getattr(retry, "initial_delay", 0) or 0)
    ceiling = float(getattr(retry, "max_delay", 0) or 0)
    for number in range(1, attempts + 1):
        try:
            return attempt(number)
        except (stop_processing(), AgentRunError):
            raise
        except Exception:
            if number == attempts:
                raise
            span.metadata["retries"] = number
            time.sleep(min(initial * 2 ** (number - 1), ceiling))
    raise AssertionError("unreachable")  # pragma: no cover

"""What tool and sequential agents share: middleware around retried attempts (spec 4.1)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from connic import StopProcessing

from ..runtime_errors import AgentRunError
from .middleware import call_middleware, middleware_of
from .mocking import resolve_phase
from .payloads import as_payload, jsonable, user_content
from .trace import Span, Trace

if TYPE_CHECKING:
    from .orchestrator import Runtime


def operation(
    rt: Runtime,
    agent: Any,
    payload: Any,
    context: dict[str, Any],
    trace: Trace,
    span: Span,
    body: Callable[[], Any],
) -> Any:
    """A tool or sequential agent's run: middleware around retried attempts (spec 4.1).

    `before` runs once, or before every attempt with `rerun_middleware: true` (with
    `context["retry_attempt"]`); its content must come back but does not feed the tool,
    which gets the payload. `after` runs once, on the output as text.
    """
    name = agent.config.name
    middleware = middleware_of(rt, name)
    before = resolve_phase(
        rt, "middleware", middleware.before if middleware else None, name, "before"
    )
    after = resolve_phase(rt, "middleware", middleware.after if middleware else None, name, "after")
    retry = getattr(agent.config, "retry_options", None)
    rerun = bool(getattr(retry, "rerun_middleware", False))
    content = user_content(as_payload(payload))

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
        return body()

    output = with_retries(agent, span, attempt)
    if after is not None:
        text = output if isinstance(output, str) else json.dumps(jsonable(output))
        output = call_middleware("after", after, text, context, trace, span)
    return output


def with_retries(agent: Any, span: Span, attempt: Callable[[int], Any]) -> Any:
    """retry_options for tool and sequential agents: operation attempts, the first
    included (spec 2.2)."""
    retry = getattr(agent.config, "retry_options", None)
    attempts = int(getattr(retry, "attempts", 1) or 1)
    initial = float(getattr(retry, "initial_delay", 0) or 0)
    ceiling = float(getattr(retry, "max_delay", 0) or 0)
    for number in range(1, attempts + 1):
        try:
            return attempt(number)
        except (StopProcessing, AgentRunError):
            raise
        except Exception:
            if number == attempts:
                raise
            span.metadata["retries"] = number
            time.sleep(min(initial * 2 ** (number - 1), ceiling))
    raise AssertionError("unreachable")  # pragma: no cover

"""Agent middleware (spec 4.1): finding an agent's middleware module and calling a phase.

Which phases run, and when, is the agent kind's business (operation.py for tool and
sequential agents, llm.py for LLM agents); a phase's mock is chosen in mocking.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..runtime_errors import AgentRunError
from .trace import Span, Trace, timed
from .usercode import call_user_function

if TYPE_CHECKING:
    from .port import RuntimePort


def middleware_of(rt: RuntimePort, name: str) -> Any:
    """The agent's `middleware/<agent>.py` as the SDK loads it, or None."""
    if rt.loader is None:
        return None
    return rt.loader.load_middleware(name)


def call_middleware(
    phase: str,
    func: Callable[..., Any],
    value: Any,
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
) -> Any:
    with timed(trace.open("middleware", f"middleware.{phase}", parent)) as span:
        result = call_user_function(func, value, context)
    if result is None:
        span.status = "error"
        raise AgentRunError(f"middleware {phase}() returned None; it must return its input")
    return result

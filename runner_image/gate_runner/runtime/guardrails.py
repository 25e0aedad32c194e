"""Running an LLM agent's guardrails on its input or output: spans for each rule, and the
custom rules' code (or its mock). The rules themselves live in gate_runner/guardrails.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..guardrails import run_rules
from .mocking import violate
from .trace import Span, Trace
from .usercode import call_user_function

if TYPE_CHECKING:
    from .orchestrator import Runtime


def run_guardrails(
    rt: Runtime,
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

    return run_rules(
        rules, direction, text, context, custom=custom, call=call_user_function, record=record
    )

"""Sequential agents: a chain of agents, each stage fed the previous stage's output."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .operation import operation
from .trace import Span, Trace

if TYPE_CHECKING:
    from .port import RuntimePort


def run_sequential(
    rt: RuntimePort,
    agent: Any,
    payload: Any,
    context: dict[str, Any],
    trace: Trace,
    span: Span,
) -> Any:
    def chain(value: Any) -> Any:
        for stage in agent.config.agents:
            value = rt.run_agent(stage, value, context, trace, span)
        return value

    return operation(rt, agent, payload, context, trace, span, chain)

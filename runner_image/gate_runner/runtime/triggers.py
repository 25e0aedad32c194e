"""trigger_agent and trigger_agent_at (spec 3.2): children of the run in progress, and the
`connic.tools` names that reach them from user code."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..ids import uuid4_text
from .payloads import as_payload, jsonable
from .toolset import predefined_stubs

if TYPE_CHECKING:
    from .port import RunOutcome, RuntimePort


def trigger(
    rt: RuntimePort,
    agent_name: str,
    payload: Any,
    wait_for_response: bool = True,
    timeout_seconds: int = 60,
) -> dict[str, Any]:
    """trigger_agent: waited children run here, in-process, with their own run."""
    rt.check_deadline()
    trace, parent, parent_context = rt.current_frame()
    run_id = uuid4_text()
    span = trace.open(
        "child_agent",
        agent_name,
        parent,
        agent_name=agent_name,
        payload=jsonable(payload),
        wait_for_response=wait_for_response,
        run_id=run_id,
    )
    if agent_name not in rt.agents:
        span.status = "error"
        span.metadata["error"] = f"agent {agent_name!r} does not exist"
        return {
            "run_id": run_id,
            "status": "failed",
            "response": None,
            "error": f"agent {agent_name!r} does not exist",
        }
    if not wait_for_response:
        # Fire-and-forget is recorded, never run: its payload is what tests can check.
        return {"run_id": run_id}
    started = time.monotonic()
    # The child runs in a thread of its own so that timeout_seconds can be kept: past
    # it the parent gets status "timeout" (spec 3.2), and the child, which cannot be
    # killed alone, is left to the invocation's own timeout.
    box: list[RunOutcome] = []
    context = contextvars.copy_context()
    worker = threading.Thread(
        target=lambda: box.append(
            context.run(
                rt.run,
                agent_name,
                as_payload(payload),
                trace,
                span,
                run_id=run_id,
                parent_run_id=parent_context.get("run_id"),
            )
        ),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=float(timeout_seconds))
    span.duration_ms = int((time.monotonic() - started) * 1000)
    if not box:
        span.status = "error"
        span.metadata.update(status="timeout", error=f"no answer in {timeout_seconds} s")
        return {
            "run_id": run_id,
            "status": "timeout",
            "response": None,
            "error": f"agent {agent_name!r} did not answer in {timeout_seconds} s",
        }
    outcome = box[0]
    span.status = "ok" if outcome.status == "completed" else "error"
    span.metadata.update(
        status=outcome.status, output=jsonable(outcome.output), error=outcome.error
    )
    # Parent code gets the platform's statuses (spec 3.2). "blocked" exists only for
    # assertions (the span keeps it); a blocked child's run is stored as completed, or as
    # failed with the rule's fail_run.
    status = outcome.status
    if status == "blocked":
        status = str(outcome.run_context.get("stored_status") or "completed")
    result = {"run_id": run_id, "status": status, "response": outcome.output}
    if outcome.error:
        result["error"] = outcome.error
    return result


def trigger_at(
    rt: RuntimePort, agent_name: str, payload: Any, delay: Any = None, unix_timestamp: Any = None
) -> dict[str, Any]:
    """trigger_agent_at is always fire-and-forget in a gate: recorded, never run."""
    rt.check_deadline()
    trace, parent, _ = rt.current_frame()
    run_id = uuid4_text()
    trace.open(
        "child_agent",
        agent_name,
        parent,
        agent_name=agent_name,
        payload=jsonable(payload),
        wait_for_response=False,
        scheduled=True,
        run_id=run_id,
    )
    return {
        "run_id": run_id,
        "scheduled_at": datetime.now(UTC).isoformat(),
        "status": "scheduled",
    }


def install_predefined(runtime: RuntimePort) -> None:
    """Make `from connic.tools import trigger_agent` reach this runtime.

    Must run before user modules are imported: they bind the name at import time.
    """
    stubs = predefined_stubs()  # the SDK's own, before they are replaced
    import connic.tools as connic_tools

    async def trigger_agent(
        agent_name: str, payload: Any, wait_for_response: bool = True, timeout_seconds: int = 60
    ) -> dict[str, Any]:
        import asyncio  # running: user code awaits this

        # The child may run async user code of its own: give it a thread and its own loop.
        return await asyncio.to_thread(
            runtime.trigger, agent_name, payload, wait_for_response, timeout_seconds
        )

    async def trigger_agent_at(
        agent_name: str, payload: Any, delay: Any = None, unix_timestamp: Any = None
    ) -> dict[str, Any]:
        return runtime.trigger_at(agent_name, payload, delay, unix_timestamp)

    connic_tools.trigger_agent = trigger_agent
    connic_tools.trigger_agent_at = trigger_agent_at
    for name in stubs:
        implementation = runtime.predefined.get(name)
        if implementation is not None:
            setattr(connic_tools, name, _as_async(implementation))


def _as_async(func: Callable[..., Any]) -> Callable[..., Any]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    call.__name__ = func.__name__
    return call

"""The runtime of one invocation: its state, one agent run from start to outcome, and the
dispatch to each agent kind. What an agent kind or a call phase does lives in its own module.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..approvals import Approvals, AwaitingApproval
from ..guardrails import GuardrailBlocked
from ..ids import uuid4_text
from ..mocks import Mocks, StrictFlags, StrictViolation
from ..predefined import Predefined, page_answer, web_read_page
from ..runtime_errors import AgentNotFound, AgentRunError, InvocationTimedOut, ModelCallError
from . import triggers
from .middleware import middleware_of
from .mocking import resolve_phase
from .model_choice import model_for
from .payloads import as_payload, jsonable
from .port import Frame, RunOutcome
from .sdk import stop_processing
from .sequential import run_sequential
from .tool_agent import run_tool_agent
from .trace import Span, Trace, error_text, timed
from .usercode import call_user_function

if TYPE_CHECKING:
    from ..models import GatewayChannel, Model
    from .mcp_tools import McpTools


class RunTimedOut(AgentRunError):
    """A child's or a stage's own `timeout` passed: its run fails (spec 13.19)."""


@dataclass
class RunState:
    """One run in progress: when it started, the tokens its model calls used, and the
    agents that took part (its own, and a chain's stages), each with its span."""

    started: float
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    agents: dict[str, Span] = field(default_factory=dict)


class Runtime:
    """Runs agents of one loaded project for one invocation."""

    def __init__(
        self,
        agents: Mapping[str, Any],
        *,
        loader: Any = None,
        project: Path | None = None,
        model_mode: str | None = None,
        gateway: GatewayChannel | None = None,
        guardrail_model: str | None = None,
    ) -> None:
        self.agents = agents
        self.loader = loader
        self.project = project
        self.model_mode = model_mode
        # The case's model gateway channel, when it has one: live models go through it.
        self.gateway = gateway
        # The project's judge model for the judged guardrails (judge.py); None: it names none.
        self.guardrail_model = guardrail_model
        # Each agent's model, chosen on its first use in this invocation (model_choice.py).
        self.models: dict[str, Model] = {}
        # Session agents' histories in this invocation, by agent and key (sessions.py).
        self.sessions: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.predefined = Predefined()
        self.predefined.read_page = self.web_page
        self.mocks = Mocks(None, StrictFlags())
        self.approvals = Approvals()
        # Strict-flag and mock-signature violations: they fail the invocation whatever the
        # run's own status says.
        self.violations: list[str] = []
        # The frames of the runs in progress. A ContextVar, not a list: children triggered
        # in parallel (asyncio.gather over trigger_agent) each run in their own thread with
        # a copy of the context, so each sees its own parent.
        self._frames: contextvars.ContextVar[tuple[Frame, ...]] = contextvars.ContextVar(
            "gate_runner_frames", default=()
        )
        # The runs in progress, by their context dict (a chain's stages share their run's).
        self._runs: dict[int, RunState] = {}
        # Each run's MCP tools, by its context and agent (a chain's stages share a context).
        self.mcp_tools: dict[tuple[int, str], McpTools] = {}
        # When the innermost timed agent of this context must be done (monotonic): the
        # code of an agent past its timeout, which a thread cannot stop, may no longer
        # call a model, a tool, another agent or a stage.
        self._deadline: contextvars.ContextVar[float] = contextvars.ContextVar(
            "gate_runner_deadline", default=math.inf
        )
        # Set when the invocation's timeout_s has passed (case.py's stop signal): the error
        # the run fails with. Every run still in progress ends with it at its next step.
        self.stopping: str | None = None
        # Once the outermost run has ended (its cleanup and the builder's are what remains):
        # the stop signal no longer interrupts anything.
        self.ending = False
        # The outermost run's context, which case.py reports as it changes (issue 39: a
        # builder's cleanup after a timeout or a crash gets it).
        self.root_context: dict[str, Any] | None = None

    def web_page(self, url: str, follow_redirects: bool = True) -> dict[str, Any]:
        """web_read_page for the agent whose run calls it: from its recordings in replay
        mode, else through the case's model gateway (the project's egress allowlist, every
        page recorded), else directly (only a case the operator gave a network reaches any)."""
        from ..models import GatewayModel, ReplayModel

        agent = str(self.current_frame()[2].get("agent_name") or "")
        chosen: Model | None = None
        if agent and self.project is not None:
            try:
                chosen = model_for(self, agent)
            except AgentRunError:
                if self.model_mode == "replay":
                    raise  # a replay gate never goes live
                chosen = None  # live without a gateway: the direct fetch below
        if isinstance(chosen, ReplayModel | GatewayModel):
            return page_answer(chosen.fetch(url, follow_redirects))
        if self.model_mode == "replay":
            raise AgentRunError(f"replay mode: no recordings answer web_read_page {url}")
        if self.gateway is not None:
            return page_answer(GatewayModel(self.gateway, agent=agent).fetch(url, follow_redirects))
        return web_read_page(url, follow_redirects)

    def current_frame(self) -> Frame:
        """The innermost run in progress in this context: where a trigger opens its span."""
        frames = self._frames.get()
        return frames[-1] if frames else (Trace(), None, {})

    # -- entry points -----------------------------------------------------------------------

    def run(
        self,
        agent_name: str,
        payload: dict[str, Any],
        trace: Trace,
        parent: Span | None = None,
        *,
        run_id: str | None = None,
        parent_run_id: str | None = None,
    ) -> RunOutcome:
        context: dict[str, Any] = {
            "run_id": run_id or uuid4_text(),
            "agent_name": agent_name,
            # Decided (issue 19, item 11): the SDK's Middleware docstring says the context is
            # "pre-populated with system metadata (run_id, agent_name, connector_id,
            # timestamp)"; no connector triggers a gate's run, so it is there and null.
            "connector_id": None,
            "timestamp": datetime.now(UTC).isoformat(),
            "payload": payload,
        }
        if parent_run_id:
            context["parent_run_id"] = parent_run_id
        if not self._runs and self.root_context is None:
            self.root_context = context
        state = self._runs[id(context)] = RunState(started=time.monotonic())
        publish = True
        stopped: InvocationTimedOut | None = None
        provider_failure: str | None = None
        token = self._frames.set((*self._frames.get(), (trace, parent, context)))
        try:
            output = self.run_agent(agent_name, payload, context, trace, parent)
            status, error = "completed", None
        except stop_processing() as stop:
            # Spec §3.1: StopProcessing ends the whole run gracefully with its message.
            output = getattr(stop, "response", str(stop))
            status, error = "completed", None
            publish = bool(getattr(stop, "publish_outbound", True))
        except AwaitingApproval:
            output, status, error = None, "awaiting_approval", None
        except GuardrailBlocked as blocked:
            # `blocked` is the assertion-level status; the stored status is kept beside it.
            output, status = blocked.message, "blocked"
            error = blocked.message if blocked.fail_run else None
            context["stored_status"] = "failed" if blocked.fail_run else "completed"
        except AgentNotFound:
            raise
        except Exception as exc:
            output, status, error = None, "failed", error_text(exc)
            if isinstance(exc, ModelCallError) and exc.outside_the_agent:
                provider_failure = error
        except InvocationTimedOut as exc:
            # timeout_s passed (issue 39): this run fails, and its cleanup still runs below;
            # a run inside another then hands the stop on to the one around it.
            output, status, error, stopped = None, "failed", str(exc), exc
        finally:
            self._frames.reset(token)
        nested = bool(self._frames.get())
        if not nested:
            self.ending = True
        self.execution_finished(context)
        if parent is None and status == "completed":
            # Outbound connectors would publish this run; a gate records, never delivers.
            trace.open(
                "outbound",
                "outbound",
                None,
                delivered=False,
                would_publish=publish,
                output=jsonable(output),
            )
        outcome = RunOutcome(
            status=status,
            output=output,
            error=error,
            run_context=context,
            provider_failure=provider_failure,
        )
        if status != "awaiting_approval":
            # Decided (issue 39): a run waiting for an approval has not ended (the platform
            # resumes it; a gate never does), so its cleanup never comes.
            self._cleanup(state, outcome, trace)
        del self._runs[id(context)]
        for key in [k for k in self.mcp_tools if k[0] == id(context)]:
            del self.mcp_tools[key]
        if stopped is not None and nested:
            raise stopped
        return outcome

    def execution_finished(self, context: dict[str, Any]) -> None:
        """`duration_ms` and `token_usage` in the run context, as `after` and the stored run
        see them (spec 4.4: added when execution finishes, so not seen by tool calls)."""
        state = self._runs.get(id(context))
        if state is not None:
            context["duration_ms"] = int((time.monotonic() - state.started) * 1000)
            context["token_usage"] = dict(state.usage)

    def count_tokens(self, context: dict[str, Any], usage: Mapping[str, Any]) -> None:
        """Add one model call's token usage to its run's."""
        state = self._runs.get(id(context))
        if state is None:
            return
        counts = {k: int(v) for k, v in usage.items() if isinstance(v, int | float)}
        if "total_tokens" not in counts:
            counts["total_tokens"] = counts.get("prompt_tokens", 0) + counts.get(
                "completion_tokens", 0
            )
        for key, value in counts.items():
            state.usage[key] = state.usage.get(key, 0) + value

    def _cleanup(self, state: RunState, outcome: RunOutcome, trace: Trace) -> None:
        """Each middleware `cleanup` of the run's agents, last, once the run has ended.

        SDK Middleware: it "runs last, once the run has ended, whether it completed, failed,
        timed out or was cancelled" with `run` = {status, error, output}, and "its errors are
        logged and never change the run's status". Its mock is `middleware_cleanup(run,
        context)`; strict_middleware_mocks fails the invocation just before a real one would
        run (the violation is recorded; the run's status stays). A chain's stages clean up
        before the chain itself, the latest first.
        """
        run = {"status": outcome.ended_as, "error": outcome.error, "output": outcome.output}
        for name, span in reversed(state.agents.items()):
            middleware = middleware_of(self, name)
            try:
                func = resolve_phase(
                    self, "middleware", middleware.cleanup if middleware else None, name, "cleanup"
                )
            except StrictViolation:
                continue  # recorded in self.violations: it fails the invocation
            if func is None:
                continue
            cleanup = trace.open("middleware", "middleware.cleanup", span)
            started = time.monotonic()
            try:
                call_user_function(func, run, outcome.run_context)
            except Exception as exc:  # StopProcessing too: the run has already ended
                cleanup.status = "error"
                cleanup.metadata["error"] = error_text(exc)
                traceback.print_exc()  # onto the invocation's stderr: its log spans
            cleanup.duration_ms = int((time.monotonic() - started) * 1000)

    def trigger(
        self,
        agent_name: str,
        payload: Any,
        wait_for_response: bool = True,
        timeout_seconds: int = 60,
    ) -> dict[str, Any]:
        """trigger_agent from a tool call or from user code (triggers.trigger)."""
        return triggers.trigger(self, agent_name, payload, wait_for_response, timeout_seconds)

    def trigger_at(
        self, agent_name: str, payload: Any, delay: Any = None, unix_timestamp: Any = None
    ) -> dict[str, Any]:
        """trigger_agent_at from a tool call or from user code (triggers.trigger_at)."""
        return triggers.trigger_at(self, agent_name, payload, delay, unix_timestamp)

    # -- dispatch ---------------------------------------------------------------------------

    def run_agent(
        self,
        name: str,
        payload: Any,
        context: dict[str, Any],
        trace: Trace,
        parent: Span | None,
    ) -> Any:
        """One agent of the run (the entry agent or a sequential stage), by its kind."""
        agent = self.agents.get(name)
        if agent is None:
            raise AgentNotFound(f"agent {name!r} does not exist")
        self.check_deadline()
        kind = str(getattr(agent.config.type, "value", agent.config.type))
        span = trace.open("agent", name, parent, agent_type=kind)
        state = self._runs.get(id(context))
        if state is not None:
            state.agents.setdefault(name, span)  # its cleanup runs when the run ends
        token = self._frames.set((*self._frames.get(), (trace, span, context)))

        def dispatch() -> Any:
            if kind == "tool":
                return run_tool_agent(self, agent, payload, context, trace, span)
            if kind == "sequential":
                return run_sequential(self, agent, payload, context, trace, span)
            from .llm import run_llm_agent  # here: a case without LLM agents never loads it

            return run_llm_agent(self, agent, as_payload(payload), context, trace, span)

        limit = getattr(agent.config, "timeout", None)
        try:
            with timed(span):
                # The agent under test's own timeout is its invocation's (case.py kills the
                # process); a triggered child's and a chain stage's are kept here (issue 19,
                # item 5).
                if parent is not None and isinstance(limit, int) and limit > 0:
                    return self._within(limit, name, dispatch)
                return dispatch()
        finally:
            self._frames.reset(token)

    def check_deadline(self) -> None:
        """Refuse to go on with an agent whose own timeout has passed (see _within), or
        with any run once the invocation's timeout_s has."""
        if self.stopping is not None:
            raise InvocationTimedOut(self.stopping)
        if time.monotonic() > self._deadline.get():
            raise RunTimedOut("this agent's timeout has passed; its run has already failed")

    def _within(self, limit: int, name: str, work: Any) -> Any:
        """``work()`` bounded by the agent's own `timeout`, in a thread of its own.

        Past the limit the run fails with a reason naming the agent and its timeout. The
        thread cannot be killed: it is left to end with the invocation, and the deadline it
        carries stops it at its next model call, tool call, trigger or stage.
        """
        deadline = time.monotonic() + limit
        done: list[Any] = []
        failed: list[BaseException] = []

        def bounded() -> None:
            self._deadline.set(min(self._deadline.get(), deadline))
            try:
                done.append(work())
            except BaseException as exc:  # re-raised in the caller's thread
                failed.append(exc)

        worker = threading.Thread(target=contextvars.copy_context().run, args=(bounded,))
        worker.daemon = True
        worker.start()
        worker.join(timeout=limit)
        if worker.is_alive():
            raise RunTimedOut(f"agent {name!r} timed out after {limit} s (its timeout: {limit})")
        if failed:
            raise failed[0]
        return done[0]

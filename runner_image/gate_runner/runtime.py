"""The agent runtime: tool, sequential and LLM agents, with middleware, tool hooks and
trigger_agent (spec sections 2 to 4).

An invocation runs in its own forked process, so the runtime may keep per-run state in
plain attributes and patch ``connic.tools`` for the user code it imports.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from connic import AbortTool, StopProcessing

from .approvals import Approvals, AwaitingApproval, rejection_error, requires_approval
from .guardrails import GuardrailBlocked, run_rules
from .mocks import Mocks, StrictFlags, StrictViolation, check_arguments, normalise
from .models import Model, ModelReply, choose_model
from .predefined import Predefined
from .runtime_errors import AgentNotFound, AgentRunError

__all__ = ["AgentNotFound", "AgentRunError", "RunOutcome", "Runtime", "Span", "Trace"]

Frame = tuple["Trace", "Span | None", dict[str, Any]]
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass
class Span:
    span_id: str
    parent_span_id: str | None
    span_order: int
    type: str
    name: str
    status: str = "ok"
    duration_ms: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "span_order": self.span_order,
            "type": self.type,
            "name": self.name,
            "status": self.status,
            "duration_ms": self.duration_ms,
            "metadata": self.metadata,
        }


class Trace:
    """Spans of one invocation, in the order they were opened."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()  # parallel children open spans from several threads

    def open(self, type_: str, name: str, parent: Span | None, **metadata: Any) -> Span:
        with self._lock:
            span = Span(
                span_id=f"s{len(self.spans) + 1}",
                parent_span_id=parent.span_id if parent else None,
                span_order=len(self.spans) + 1,
                type=type_,
                name=name,
                metadata=dict(metadata),
            )
            self.spans.append(span)
        return span


@dataclass
class RunOutcome:
    """What one agent run ended with, before any assertion looks at it."""

    status: str  # completed | failed | cancelled | blocked | awaiting_approval
    output: Any
    error: str | None
    run_context: dict[str, Any]


def error_text(exc: BaseException) -> str:
    """How an error reads in a span or a run: our own messages plain, others with a type."""
    return str(exc) if isinstance(exc, AgentRunError) else f"{type(exc).__name__}: {exc}"


@contextmanager
def timed(span: Span) -> Iterator[Span]:
    """Time a span's work and record how it ended: stopped, failed, or fine."""
    started = time.monotonic()
    try:
        yield span
    except StopProcessing:
        span.metadata["stopped"] = True
        raise
    except Exception as exc:
        span.status = "error"
        span.metadata["error"] = error_text(exc)
        raise
    finally:
        span.duration_ms = int((time.monotonic() - started) * 1000)


def jsonable(value: Any) -> Any:
    """Make a value safe for the JSON result; what JSON cannot hold is shown by repr."""
    try:
        return json.loads(json.dumps(value, default=repr))
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def as_payload(value: Any, *, text_key: str = "message") -> dict[str, Any]:
    """The payload dict an agent receives (spec 2.1, 7.1): a JSON object as it is, other JSON
    as {"input": value}, and text that is not JSON under ``text_key``."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return {text_key: value}
        return decoded if isinstance(decoded, dict) else {"input": decoded}
    return {"input": value}


def stage_input(value: Any) -> dict[str, Any]:
    """What a tool agent receives from an upstream stage: plain text arrives as input."""
    return as_payload(value, text_key="input")


def call_user_function(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call sync or async user code and return its result."""
    result = func(*args, **kwargs)
    if inspect.isawaitable(result):

        async def _await() -> Any:
            return await result

        return asyncio.run(_await())
    return result


def _accepts(func: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def render_prompt(template: str, context: Mapping[str, Any]) -> str:
    """`{var}` from the run context; placeholders with no match stay as written (spec §2.2)."""

    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        return str(context[key]) if key in context else match.group(0)

    return PLACEHOLDER.sub(sub, template)


def user_content(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The middleware-facing message (spec §4.1, §7.4): text part, then one part per file."""
    files = payload.get("files") if isinstance(payload.get("files"), list) else []
    rest = {k: v for k, v in payload.items() if k != "files"}
    text = rest["message"] if set(rest) == {"message"} else json.dumps(rest, default=str)
    parts: list[dict[str, Any]] = [{"text": str(text)}]
    for f in files or []:
        if isinstance(f, Mapping):
            parts.append(
                {"data": f.get("data"), "mime_type": f.get("mime_type"), "name": f.get("name")}
            )
    return {"role": "user", "parts": parts}


def content_to_message(content: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI-style user message from middleware content parts."""
    parts = content.get("parts") or []
    texts = [str(p["text"]) for p in parts if isinstance(p, Mapping) and "text" in p]
    files = [p for p in parts if isinstance(p, Mapping) and "data" in p]
    if not files:
        return {"role": "user", "content": "\n".join(texts)}
    body: list[dict[str, Any]] = [{"type": "text", "text": t} for t in texts]
    for p in files:
        data = p["data"]
        if isinstance(data, bytes | bytearray):
            import base64

            data = base64.b64encode(bytes(data)).decode("ascii")
        body.append(
            {
                "type": "file",
                "file": {
                    "filename": p.get("name"),
                    "mime_type": p.get("mime_type"),
                    "file_data": data,
                },
            }
        )
    return {"role": "user", "content": body}


def tool_schema(tool: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": tool.parameters or {"type": "object", "properties": {}},
        },
    }


def _sdk_stubs() -> dict[str, Callable[..., Any]]:
    """The SDK's predefined-tool stubs, captured before install_predefined replaces them."""
    import connic.tools as connic_tools

    names = ("trigger_agent", "trigger_agent_at", "db_find", "db_insert", "db_update",
             "db_upsert", "db_delete", "db_count", "db_list_collections", "retrieval_query",
             "retrieval_store", "retrieval_delete", "retrieval_list_namespaces", "web_search",
             "web_read_page", "query_knowledge", "store_knowledge", "delete_knowledge",
             "kb_list_namespaces")  # fmt: skip
    return {n: getattr(connic_tools, n) for n in names if hasattr(connic_tools, n)}


PREDEFINED_STUBS = _sdk_stubs()

PREDEFINED_SCHEMAS: dict[str, dict[str, Any]] = {
    "trigger_agent": {
        "type": "object",
        "properties": {
            "agent_name": {"type": "string"},
            "payload": {},
            "wait_for_response": {"type": "boolean"},
            "timeout_seconds": {"type": "integer"},
        },
        "required": ["agent_name", "payload"],
    },
}


class ApprovalRejected(AgentRunError):
    """A rejected (or timed-out) approval with on_rejection: fail ends the run failed."""


class Runtime:
    """Runs agents of one loaded project for one invocation."""

    def __init__(
        self,
        agents: Mapping[str, Any],
        *,
        loader: Any = None,
        project: Path | None = None,
        model_mode: str | None = None,
    ) -> None:
        self.agents = agents
        self.loader = loader
        self.project = project
        self.model_mode = model_mode
        self._models: dict[str, Model] = {}
        self.predefined = Predefined()
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

    def _frame(self) -> Frame:
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
            "run_id": run_id or str(uuid.uuid4()),
            "agent_name": agent_name,
            "timestamp": datetime.now(UTC).isoformat(),
            "payload": payload,
        }
        if parent_run_id:
            context["parent_run_id"] = parent_run_id
        started = time.monotonic()
        publish = True
        token = self._frames.set((*self._frames.get(), (trace, parent, context)))
        try:
            output = self._run_agent(agent_name, payload, context, trace, parent)
            status, error = "completed", None
        except StopProcessing as stop:
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
        finally:
            self._frames.reset(token)
        context["duration_ms"] = int((time.monotonic() - started) * 1000)
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
        return RunOutcome(status=status, output=output, error=error, run_context=context)

    def trigger(
        self,
        agent_name: str,
        payload: Any,
        wait_for_response: bool = True,
        timeout_seconds: int = 60,
    ) -> dict[str, Any]:
        """trigger_agent: waited children run here, in-process, with their own run."""
        trace, parent, parent_context = self._frame()
        run_id = str(uuid.uuid4())
        span = trace.open(
            "child_agent",
            agent_name,
            parent,
            agent_name=agent_name,
            payload=jsonable(payload),
            wait_for_response=wait_for_response,
            run_id=run_id,
        )
        if agent_name not in self.agents:
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
                    self.run,
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
        result = {"run_id": run_id, "status": outcome.status, "response": outcome.output}
        if outcome.error:
            result["error"] = outcome.error
        return result

    def trigger_at(
        self, agent_name: str, payload: Any, delay: Any = None, unix_timestamp: Any = None
    ) -> dict[str, Any]:
        """trigger_agent_at is always fire-and-forget in a gate: recorded, never run."""
        trace, parent, _ = self._frame()
        run_id = str(uuid.uuid4())
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

    # -- agents -----------------------------------------------------------------------------

    def _run_agent(
        self,
        name: str,
        payload: Any,
        context: dict[str, Any],
        trace: Trace,
        parent: Span | None,
    ) -> Any:
        agent = self.agents.get(name)
        if agent is None:
            raise AgentNotFound(f"agent {name!r} does not exist")
        kind = str(getattr(agent.config.type, "value", agent.config.type))
        span = trace.open("agent", name, parent, agent_type=kind)
        token = self._frames.set((*self._frames.get(), (trace, span, context)))
        try:
            with timed(span):
                if kind == "tool":
                    return self._operation(
                        agent,
                        payload,
                        context,
                        trace,
                        span,
                        lambda: self._run_tool_agent(
                            agent, stage_input(payload), context, trace, span
                        ),
                    )
                if kind == "sequential":

                    def chain() -> Any:
                        value = payload
                        for stage in agent.config.agents:
                            value = self._run_agent(stage, value, context, trace, span)
                        return value

                    return self._operation(agent, payload, context, trace, span, chain)
                return self._run_llm_agent(agent, as_payload(payload), context, trace, span)
        finally:
            self._frames.reset(token)

    def _operation(
        self,
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
        middleware = self._middleware(name)
        before = self._phase(
            "middleware", middleware.before if middleware else None, name, "before"
        )
        after = self._phase("middleware", middleware.after if middleware else None, name, "after")
        retry = getattr(agent.config, "retry_options", None)
        rerun = bool(getattr(retry, "rerun_middleware", False))
        content = user_content(as_payload(payload))

        def attempt(number: int) -> Any:
            if before is not None and (number == 1 or rerun):
                if rerun:
                    context["retry_attempt"] = number - 1
                returned = self._middleware_phase("before", before, content, context, trace, span)
                if not isinstance(returned, dict):
                    raise AgentRunError(
                        f"middleware before() for {name!r} must return the content dict, "
                        f"got {type(returned).__name__}"
                    )
            return body()

        output = self._with_retries(agent, span, attempt)
        if after is not None:
            text = output if isinstance(output, str) else json.dumps(jsonable(output))
            output = self._middleware_phase("after", after, text, context, trace, span)
        return output

    @staticmethod
    def _with_retries(agent: Any, span: Span, attempt: Callable[[int], Any]) -> Any:
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

    def _run_tool_agent(
        self,
        agent: Any,
        payload: dict[str, Any],
        context: dict[str, Any],
        trace: Trace,
        parent: Span,
    ) -> Any:
        tool = agent.tools[0]
        span = trace.open(
            "tool_call",
            tool.name,
            parent,
            tool_ref=tool.ref or tool.name,
            tool_name=tool.name,
            params=jsonable(payload),
            mocked=False,
        )
        with timed(span):
            result = self._call_custom_tool(tool, {"payload": payload}, context, span)
        span.metadata["result"] = jsonable(result)
        return result

    # -- LLM agents -------------------------------------------------------------------------

    def _model(self, name: str) -> Model:
        if name not in self._models:
            if self.project is None:
                raise AgentRunError("LLM agents need the project directory to find their model")
            retry = getattr(self.agents[name].config, "retry_options", None)
            self._models[name] = choose_model(
                self.project, name, self.model_mode, attempts=int(getattr(retry, "attempts", 3))
            )
        return self._models[name]

    def _middleware(self, name: str) -> Any:
        if self.loader is None:
            return None
        return self.loader.load_middleware(name)

    def _hooks(self, name: str) -> Any:
        if self.loader is None:
            return None
        return self.loader.load_tool_hooks(name)

    def _run_llm_agent(
        self,
        agent: Any,
        payload: dict[str, Any],
        context: dict[str, Any],
        trace: Trace,
        span: Span,
    ) -> Any:
        config = agent.config
        middleware = self._middleware(config.name)
        content = user_content(payload)
        rails = config.guardrails
        if rails is not None and rails.input:
            raw_text = "\n".join(str(p["text"]) for p in content["parts"] if "text" in p)
            try:
                redacted = self._guardrails(rails.input, "input", raw_text, context, trace, span)
            except GuardrailBlocked as blocked:
                # Spec §4.1: the agent never runs; `after` still sees the rejection message.
                after = (
                    self._phase(
                        "middleware",
                        middleware.after if middleware else None,
                        config.name,
                        "after",
                    )
                    if rails.run_after_on_block  # first: a phase that will not run is not due
                    else None
                )
                if after is not None:
                    blocked.message = self._middleware_phase(
                        "after", after, blocked.message, context, trace, span
                    )
                raise
            if redacted != raw_text:
                content = {
                    **content,
                    "parts": [{"text": redacted}]
                    + [p for p in content["parts"] if "text" not in p],
                }
        before = self._phase(
            "middleware", middleware.before if middleware else None, config.name, "before"
        )
        if before is not None:
            content = self._middleware_phase("before", before, content, context, trace, span)
            if not isinstance(content, dict):
                raise AgentRunError(
                    f"middleware before() for {config.name!r} must return the content dict, "
                    f"got {type(content).__name__}"
                )
        output = self._llm_loop(agent, content, context, trace, span)
        after = self._phase(
            "middleware", middleware.after if middleware else None, config.name, "after"
        )
        if after is not None:
            output = self._middleware_phase("after", after, output, context, trace, span)
            if output is None:
                raise AgentRunError(
                    f"middleware after() for {config.name!r} returned None; it must return "
                    "the response"
                )
        if rails is not None and rails.output:
            text = output if isinstance(output, str) else json.dumps(jsonable(output))
            checked = self._guardrails(rails.output, "output", text, context, trace, span)
            if checked != text:
                output = checked
        return output

    def _guardrails(
        self,
        rules: list[Any],
        direction: str,
        text: str,
        context: dict[str, Any],
        trace: Trace,
        parent: Span,
    ) -> str:
        def record(name: str, where: str, status: str, message: str | None, ms: int) -> None:
            trace.open("guardrail", name, parent, direction=where, message=message).status = status
            trace.spans[-1].duration_ms = ms

        def custom(name: str) -> Callable[..., Any] | None:
            # The real file must still import cleanly, mocked or not (spec 8.2).
            found = self.loader.load_guardrail(name) if self.loader is not None else None
            if found is None:
                return None
            mock = self.mocks.guardrail(direction, name)
            if mock is not None:
                return mock
            if self.mocks.strict.guardrails:
                self._violate(
                    f"strict_guardrail_mocks: the real custom guardrail {name!r} would run "
                    f"({direction}); the mocks module has no replacement for it"
                )
            check: Callable[..., Any] = found.check
            return check

        return run_rules(
            rules, direction, text, context, custom=custom, call=call_user_function, record=record
        )

    def _middleware_phase(
        self,
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

    def _visible_tools(self, agent: Any, context: dict[str, Any]) -> list[Any]:
        from .expr import EvaluationError, ExpressionError, compile_expression

        visible = []
        for tool in agent.tools:
            condition = getattr(tool, "condition", None)
            if condition:
                try:
                    expr = compile_expression(condition, ("context", "input"))
                    if not expr.holds({"context": context, "input": context.get("payload", {})}):
                        continue
                except (ExpressionError, EvaluationError):
                    continue  # spec §2.3: an error hides the tool
            visible.append(tool)
        return visible

    def _llm_loop(
        self,
        agent: Any,
        content: dict[str, Any],
        context: dict[str, Any],
        trace: Trace,
        span: Span,
    ) -> Any:
        config = agent.config
        model = self._model(config.name)
        tools = {t.name: t for t in self._visible_tools(agent, context)}
        schemas = []
        for tool in tools.values():
            if tool.is_predefined:
                schema = self._predefined_schema(tool.name)
                schemas.append(
                    {
                        "type": "function",
                        "function": {
                            "name": tool.name,
                            "description": tool.description or "",
                            "parameters": schema,
                        },
                    }
                )
            else:
                schemas.append(tool_schema(tool))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": render_prompt(config.system_prompt or "", context)},
            content_to_message(content),
        ]
        span.metadata.update(model=config.model, model_mode=model.mode)
        for iteration in range(config.max_iterations):
            reply = self._call_model(
                model, config, messages, schemas, context, trace, span, iteration
            )
            if not reply.tool_calls:
                return self._final_output(agent, reply.content or "")
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
                result = self._llm_tool_call(
                    agent, tools, call.name, call.arguments, context, trace, span
                )
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "name": call.name,
                        "content": result
                        if isinstance(result, str)
                        else json.dumps(jsonable(result)),
                    }
                )
        raise AgentRunError(
            f"max_iterations ({config.max_iterations}) reached without a final answer"
        )

    def _call_model(
        self,
        model: Model,
        config: Any,
        messages: list[dict[str, Any]],
        schemas: list[dict[str, Any]],
        context: dict[str, Any],
        trace: Trace,
        parent: Span,
        iteration: int,
    ) -> ModelReply:
        span = trace.open(
            "model_call",
            config.model or "model",
            parent,
            iteration=iteration,
            mode=model.mode,
            temperature=config.temperature,
        )
        with timed(span):
            reply = model.complete(
                model=config.model or "",
                messages=messages,
                tools=schemas,
                temperature=config.temperature,
                context=context,
            )
        span.metadata.update(
            content=reply.content,
            tool_calls=[{"name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
        )
        return reply

    def _predefined_schema(self, name: str) -> dict[str, Any]:
        """The JSON schema the SDK's own stub declares (its signature and docstring)."""
        stub = PREDEFINED_STUBS.get(name)
        if stub is not None and self.loader is not None:
            try:
                return dict(self.loader._generate_schema(stub))
            except Exception:  # the SDK's private helper changed: fall back below
                pass
        return PREDEFINED_SCHEMAS.get(name, {"type": "object", "properties": {}})

    def _final_output(self, agent: Any, text: str) -> Any:
        schema = getattr(agent.config, "output_schema_dict", None)
        if not schema:
            return text
        try:
            value = json.loads(text)
        except ValueError:
            raise AgentRunError(
                f"output_schema {agent.config.output_schema!r}: the model's answer is not JSON: "
                f"{text[:200]!r}"
            ) from None
        problem = schema_problem(value, schema)
        if problem:
            raise AgentRunError(f"output_schema {agent.config.output_schema!r}: {problem}")
        return value

    def _llm_tool_call(
        self,
        agent: Any,
        tools: Mapping[str, Any],
        name: str,
        arguments: dict[str, Any],
        context: dict[str, Any],
        trace: Trace,
        parent: Span,
    ) -> Any:
        """One tool call with hooks around it; errors go back to the model as text."""
        tool = tools.get(name)
        ref = (tool.ref or tool.name) if tool is not None else name
        span = trace.open(
            "tool_call",
            name,
            parent,
            tool_ref=ref,
            tool_name=name,
            params=jsonable(arguments),
            mocked=False,
        )
        started = time.monotonic()
        hooks = self._hooks(agent.config.name)
        params = dict(arguments)
        try:
            if tool is None:
                # Hidden by its condition or never declared: the model asked, nothing ran.
                span.metadata["executed"] = False
                raise AgentRunError(f"unknown tool {name!r}")
            refused = self._approval(agent, tool, ref, name, params, context, trace, span)
            if refused is not None:
                span.status = "error"
                span.metadata.update(executed=False, result=jsonable(refused))
                return refused
            before = self._phase("hook", hooks.before if hooks else None, ref, "before")
            if before is not None:
                try:
                    changed = self._hook(
                        before,
                        name,
                        params,
                        context,
                        trace=trace,
                        parent=span,
                        phase="before",
                    )
                except AbortTool as abort:
                    span.status = "error"
                    result = getattr(abort, "result", str(abort))
                    span.metadata.update(aborted=True, executed=False, result=jsonable(result))
                    return result
                if isinstance(changed, dict):
                    params = {**params, **changed}
                span.metadata["params"] = jsonable(params)
            result = self._execute_tool(tool, params, context, span)
            after = self._phase("hook", hooks.after if hooks else None, ref, "after")
            if after is not None:
                replaced = self._hook(
                    after,
                    name,
                    params,
                    context,
                    result=result,
                    trace=trace,
                    parent=span,
                    phase="after",
                )
                if replaced is not None:
                    result = replaced
            span.metadata["result"] = jsonable(result)
            return result
        except (StopProcessing, StrictViolation, AwaitingApproval, ApprovalRejected):
            span.metadata["stopped"] = True
            raise
        except Exception as exc:
            span.status = "error"
            message = error_text(exc)
            span.metadata["error"] = message
            return {"error": message}
        finally:
            span.duration_ms = int((time.monotonic() - started) * 1000)

    @staticmethod
    def _hook(
        func: Callable[..., Any],
        name: str,
        params: dict[str, Any],
        context: dict[str, Any],
        **extra: Any,
    ) -> Any:
        args: list[Any] = [name, params]
        if "result" in extra:
            args.append(extra["result"])
        if _accepts(func, "context") or len(inspect.signature(func).parameters) > len(args):
            args.append(context)
        trace, parent = extra["trace"], extra["parent"]
        with timed(trace.open("hook", f"hook.{extra['phase']}", parent, tool_name=name)):
            return call_user_function(func, *args)

    def _execute_tool(
        self, tool: Any, params: dict[str, Any], context: dict[str, Any], span: Span
    ) -> Any:
        if tool.is_predefined:
            if tool.name == "trigger_agent":
                return self.trigger(**params)
            if tool.name == "trigger_agent_at":
                return self.trigger_at(**params)
            implementation = self.predefined.get(tool.name)
            if implementation is None:
                raise AgentRunError(f"predefined tool {tool.name!r} is not available in a gate")
            return implementation(**params)
        return self._call_custom_tool(tool, params, context, span)

    def _approval(
        self,
        agent: Any,
        tool: Any,
        ref: str,
        name: str,
        params: dict[str, Any],
        context: dict[str, Any],
        trace: Trace,
        parent: Span,
    ) -> Any:
        """None to go on with the call; else what the model is told instead (a rejection)."""
        if not requires_approval(agent, ref, name, params, context):
            return None
        decision = self.approvals.answer(ref, name, params)
        span = trace.open(
            "approval",
            ref,
            parent,
            params=jsonable(params),
            decision=decision.decision if decision else None,
        )
        if decision is None:
            span.status = "error"
            if self.approvals.strict:
                self._violate(
                    f"strict_approval_decisions: no approval_decisions entry answered "
                    f"the approval of {ref} with params {jsonable(params)}"
                )
            raise AwaitingApproval(f"waiting for approval of {ref}")
        if decision.decision == "approve":
            return None
        span.status = "error"
        on_rejection = getattr(agent.config.approval, "on_rejection", "fail")
        if on_rejection == "continue":
            return {"error": str(rejection_error(decision, ref))}
        raise ApprovalRejected(str(rejection_error(decision, ref)))

    def _call_custom_tool(
        self, tool: Any, params: dict[str, Any], context: dict[str, Any], span: Span
    ) -> Any:
        """A custom file tool, or its mock: mocks replace the call, strict_mocks forbid it."""
        ref = tool.ref or tool.name
        mock = self.mocks.tool(ref)
        if mock is not None:
            self._guard(lambda: check_arguments(tool.func, params, ref))
            span.metadata["mocked"] = True
            return call_user_function(mock, ref, params, context)
        if self.mocks.strict.tools:
            self._violate(
                f"strict_mocks: {ref} would run for real; no mock in the mocks module matches "
                f"it (most specific first: mock_{'_'.join(normalise(ref))})"
            )
        kwargs = dict(params)
        if _accepts(tool.func, "context"):
            kwargs["context"] = context
        return call_user_function(tool.func, **kwargs)

    def _violate(self, message: str) -> None:
        self.violations.append(message)
        raise StrictViolation(message)

    def _guard(self, check: Callable[[], None]) -> None:
        try:
            check()
        except StrictViolation as exc:
            self._violate(str(exc))

    def _phase(
        self, kind: str, real: Callable[..., Any] | None, key: str, phase: str
    ) -> Callable[..., Any] | None:
        """The function that runs a configured phase: its mock if one matches, else the real
        one (unless the phase's strict flag forbids it). A mock never adds a missing phase."""
        if real is None:
            return None
        if kind == "hook":
            mock, strict = self.mocks.hook(key, phase), self.mocks.strict.hooks
        else:
            mock, strict = self.mocks.middleware(phase), self.mocks.strict.middleware
        if mock is not None:
            return mock
        if strict:
            self._violate(
                f"strict_{kind}_mocks: the real {kind} {phase}() would run for {key}; the "
                "mocks module has no replacement for it"
            )
        return real


def schema_problem(value: Any, schema: Mapping[str, Any], where: str = "output") -> str | None:
    """A small JSON Schema check: type, required, properties, items, enum."""
    types: dict[str, type | tuple[type, ...]] = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "null": type(None),
    }
    expected = schema.get("type")
    if isinstance(expected, str) and expected in types:
        ok = isinstance(value, types[expected])
        if expected in ("integer", "number") and isinstance(value, bool):
            ok = False
        if not ok:
            return f"{where} should be {expected}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} should be one of {schema['enum']}, got {value!r}"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                return f"{where} is missing required property {key!r}"
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and isinstance(sub, Mapping):
                problem = schema_problem(value[key], sub, f"{where}.{key}")
                if problem:
                    return problem
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            problem = schema_problem(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None


def install_predefined(runtime: Runtime) -> None:
    """Make `from connic.tools import trigger_agent` reach this runtime.

    Must run before user modules are imported: they bind the name at import time.
    """
    import connic.tools as connic_tools

    async def trigger_agent(
        agent_name: str, payload: Any, wait_for_response: bool = True, timeout_seconds: int = 60
    ) -> dict[str, Any]:
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
    for name in PREDEFINED_STUBS:
        implementation = runtime.predefined.get(name)
        if implementation is not None:
            setattr(connic_tools, name, _as_async(implementation))


def _as_async(func: Callable[..., Any]) -> Callable[..., Any]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    call.__name__ = func.__name__
    return call

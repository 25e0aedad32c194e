"""Models for LLM agents, chosen per agent: scripted, replay or live (spec: runner models).

- scripted: ``tests/models/<agent>.py`` exposes ``respond(messages, tools, context)`` and
  answers like a model, for deterministic orchestration tests;
- replay: ``tests/recordings/<agent>/*.json`` hold recorded exchanges keyed by the whole
  request (model, messages, tools, temperature and the other parameters);
- live: the case's model gateway (GatewayModel, over the channel of gateway_wire.py) when
  the runner has one; else LiteLLM in this process with keys from the case's environment
  (LiveModel). `record` is live plus writing every exchange as a recording.

Default: scripted if the module exists, else replay if recordings exist, else live.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from . import gateway_wire as wire
from .runtime_errors import AgentRunError, ModelCallError


@dataclass(frozen=True)
class ToolCallRequest:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ModelReply:
    content: str | None
    tool_calls: tuple[ToolCallRequest, ...] = ()
    usage: Mapping[str, int] = field(default_factory=dict)
    # What the call itself was (the gateway's request hash, tokens, cost, latency,
    # attempts), for the model span; empty where the model is not a gateway's.
    span_metadata: Mapping[str, Any] = field(default_factory=dict)


class Model(Protocol):
    """``options``: the agent's reasoning options (gateway_wire.OPTION_KEYS), only those it
    set. ``attempts``: this call's tries, instead of the model's own (a fallback's primary
    is tried once). ``response_format``: the agent's output_schema as OpenAI's
    response_format (runtime.output_schema.response_format), None when it has none."""

    mode: str

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        context: dict[str, Any],
        options: Mapping[str, Any] | None = None,
        attempts: int | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> ModelReply: ...


def request_key(request: Mapping[str, Any]) -> str:
    """The replay key: a hash of the canonical JSON of the whole request."""
    import hashlib  # replay and record only: a live case's runner need not import it

    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_reply(raw: Any, *, source: str) -> ModelReply:
    """Accept {"content": ...} or {"tool_calls": [{"name", "arguments"}]} (OpenAI-style)."""
    if isinstance(raw, str):
        return ModelReply(content=raw)
    if not isinstance(raw, Mapping):
        raise AgentRunError(f"{source} must return a dict with content or tool_calls, got {raw!r}")
    calls = []
    for i, call in enumerate(raw.get("tool_calls") or []):
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise AgentRunError(f"{source}: tool_calls[{i}] needs a string 'name'")
        args = call.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise AgentRunError(f"{source}: tool_calls[{i}].arguments is not JSON") from None
        if not isinstance(args, dict):
            raise AgentRunError(f"{source}: tool_calls[{i}].arguments must be an object")
        calls.append(
            ToolCallRequest(
                id=str(call.get("id") or f"call_{i}"), name=call["name"], arguments=args
            )
        )
    content = raw.get("content")
    if content is not None and not isinstance(content, str):
        content = json.dumps(content)
    if content is None and not calls:
        raise AgentRunError(f"{source} returned neither content nor tool_calls")
    return ModelReply(content=content, tool_calls=tuple(calls), usage=dict(raw.get("usage") or {}))


def _load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AgentRunError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ScriptedModel:
    """``respond()`` as the model. A request whose ``respond`` raises is asked again, at once
    (no provider to wait for), up to the request's attempts (the agent's
    ``retry_options.attempts``, else 3: runtime/retries.py), as a live request is retried;
    a context-window refusal is not (compression repairs it). The script sees every try.

    ``retries``: whether a failed request is asked again, the runtime's rule
    (runtime/retries.py ``retries_request``, which model_choice passes in: this module
    imports nothing of the runtime, whose modules import it); None asks none again."""

    mode = "scripted"

    def __init__(
        self,
        path: Path,
        agent: str,
        *,
        attempts: int = 3,
        retries: Callable[[BaseException], bool] | None = None,
    ) -> None:
        self.attempts = max(1, attempts)
        self._retries = retries
        self.source = f"tests/models/{path.name}"
        module = _load_module(path, f"gate_scripted_model_{agent.replace('-', '_')}")
        respond = getattr(module, "respond", None)
        if not callable(respond):
            raise AgentRunError(f"{self.source} must define respond(messages, tools, context)")
        self._respond = respond
        # respond(messages, tools, context, options) also gets what the model is asked with.
        try:
            parameters = inspect.signature(respond).parameters
        except (TypeError, ValueError):
            parameters = {}  # type: ignore[assignment]
        self._takes_options = "options" in parameters or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
        )

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        context: dict[str, Any],
        options: Mapping[str, Any] | None = None,
        attempts: int | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> ModelReply:
        asked: dict[str, Any] | None = None
        if self._takes_options:
            # What the model is asked with: which model (the fallback's name once the primary
            # failed), its temperature and the agent's reasoning options.
            asked = {"model": model, "temperature": temperature, **dict(options or {})}
            if response_format:
                # The agent's output_schema, as live mode sends it (a copy, as the rest).
                asked["response_format"] = json.loads(json.dumps(response_format))
        retries = self._retries
        tries = max(1, attempts or self.attempts)
        for number in range(1, tries + 1):
            # The script sees copies, fresh each try: it cannot rewrite the conversation the
            # trace records, nor what its next try is asked.
            args = (
                json.loads(json.dumps(messages, default=str)),
                json.loads(json.dumps(tools)),
                context,
            )
            try:
                if asked is None:
                    raw = self._respond(*args)
                else:
                    raw = self._respond(*args, options=json.loads(json.dumps(asked)))
                break
            except Exception as exc:
                if number == tries or retries is None or not retries(exc):
                    raise
        reply = parse_reply(raw, source=f"{self.source} respond()")
        if number == 1:
            return reply
        # How many tries it took, as a gateway's reply says, when it took more than one.
        return dataclasses.replace(reply, span_metadata={"attempts": number})


class ReplayModel:
    mode = "replay"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.recordings: dict[str, Any] = {}
        for path in sorted(directory.glob("*.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
                key = record.get("key") or request_key(record["request"])
                self.recordings[key] = record["response"]
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise AgentRunError(f"recording {path.name} is not valid: {exc}") from None

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        context: dict[str, Any],
        options: Mapping[str, Any] | None = None,
        attempts: int | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> ModelReply:
        asked = dict(options or {})
        shape = dict(response_format) if response_format else None
        key = request_key(wire.replay_request(model, messages, tools, temperature, asked, shape))
        if key not in self.recordings and shape:
            # Recorded before the response format went into the key: the request without it.
            older = request_key(wire.replay_request(model, messages, tools, temperature, asked))
            key = older if older in self.recordings else key
        if key not in self.recordings and options:
            # Recorded before options went into the key: the same request without them.
            bare = request_key(wire.replay_request(model, messages, tools, temperature))
            key = bare if bare in self.recordings else key
        if key not in self.recordings:
            last = messages[-1] if messages else {}
            raise AgentRunError(
                f"no recording for this request (key {key[:16]}, model {model}, "
                f"{len(messages)} message(s), last {last.get('role')}: "
                f"{str(last.get('content'))[:120]!r}); record it again with `gate record`"
            )
        return parse_reply(self.recordings[key], source=f"recording {key[:16]}")

    def moderate(self, text: str, model: str) -> dict[str, Any]:
        """A moderation guardrail's recorded verdict (``litellm_moderation``'s shape)."""
        request = wire.ModerationRequest(model=model, input=text)
        key = request_key(request.replay_request())
        if key not in self.recordings:
            raise AgentRunError(
                f"no recording for this moderation (key {key[:16]}, model {model}, text "
                f"{text[:120]!r}); record it again from a live gate (`gate recordings`)"
            )
        return moderation_verdict(self.recordings[key], source=f"recording {key[:16]}")

    def fetch(self, url: str, follow_redirects: bool = True) -> dict[str, Any]:
        """A page web_read_page read in the recorded gate (FetchReply.raw()["fetch"])."""
        request = wire.FetchRequest(url=url, follow_redirects=follow_redirects)
        key = request_key(request.replay_request())
        recorded = self.recordings.get(key)
        if not isinstance(recorded, dict) or not isinstance(recorded.get("fetch"), dict):
            raise AgentRunError(
                f"no recording for web_read_page {url} (key {key[:16]}); record it again "
                "from a live gate (`gate recordings`)"
            )
        return dict(recorded["fetch"])

    def api(self, request: wire.ApiRequest) -> dict[str, Any]:
        """An api: tool's answer as the recorded gate had it (ApiReply.raw()["api"])."""
        key = request_key(request.replay_request())
        recorded = self.recordings.get(key)
        if not isinstance(recorded, dict) or not isinstance(recorded.get("api"), dict):
            raise AgentRunError(
                f"no recording for api:{request.api}.{request.tool} with these arguments (key "
                f"{key[:16]}); record it again from a live gate (`gate recordings`)"
            )
        return api_answer(recorded["api"], source=f"recording {key[:16]}")

    def mcp(self, request: wire.McpRequest) -> dict[str, Any]:
        """An MCP list or call as the recorded gate answered it (McpReply.raw()["mcp"])."""
        key = request_key(request.replay_request())
        recorded = self.recordings.get(key)
        if not isinstance(recorded, dict) or not isinstance(recorded.get("mcp"), dict):
            what = f"{request.op} of {request.tool}" if request.op == "call" else "tool list"
            raise AgentRunError(
                f"no recording for MCP server {request.server}'s {what} (key {key[:16]}); "
                "record it again from a live gate (`gate recordings`)"
            )
        return mcp_answer(recorded["mcp"], source=f"recording {key[:16]}")


def api_answer(raw: Any, *, source: str) -> dict[str, Any]:
    """``{"status", "body"}`` of an api: tool's call, keys in order (see mcp_answer)."""
    raw = json.loads(json.dumps(raw, sort_keys=True, default=str))
    status = raw.get("status") if isinstance(raw, dict) else None
    if isinstance(status, bool) or not isinstance(status, int):
        raise AgentRunError(f"{source}: not an API answer (no HTTP status)")
    return {"status": status, "body": raw.get("body")}


def mcp_answer(raw: Any, *, source: str) -> dict[str, Any]:
    """``{"tools": [...]}`` or ``{"result": {"is_error", "parts"}}``, each field checked.

    Every mapping in it is put in key order: an answer goes into later model requests (a
    tool's schema, a call's result), whose replay keys hash it as JSON, and a recording
    stored in Postgres (JSONB) comes back with its keys in another order than the live
    answer had."""
    raw = json.loads(json.dumps(raw, sort_keys=True, default=str))
    if isinstance(raw, dict) and isinstance(raw.get("tools"), list):
        tools = []
        for tool in raw["tools"]:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                raise AgentRunError(f"{source}: an MCP tool must have a name")
            schema = tool.get("input_schema")
            tools.append(
                {
                    "name": tool["name"],
                    "description": str(tool.get("description") or ""),
                    "input_schema": schema if isinstance(schema, dict) else {"type": "object"},
                }
            )
        return {"tools": tools}
    result = raw.get("result") if isinstance(raw, dict) else None
    if isinstance(result, dict) and isinstance(result.get("parts"), list):
        return {"result": {"is_error": bool(result.get("is_error")), "parts": result["parts"]}}
    raise AgentRunError(f"{source}: not an MCP tool list or tool result")


def moderation_verdict(raw: Any, *, source: str) -> dict[str, Any]:
    """``{"flagged", "categories", "category_scores"}`` from a recorded or gateway moderation
    (ModerationReply.raw()), each field checked."""
    verdict = raw.get("moderation") if isinstance(raw, dict) else None
    if not isinstance(verdict, dict):
        raise AgentRunError(f"{source}: not a moderation verdict")
    scores = verdict.get("category_scores")
    if not isinstance(scores, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in scores.values()
    ):
        raise AgentRunError(f"{source}: category_scores must map categories to numbers")
    return {
        "flagged": bool(verdict.get("flagged")),
        "categories": dict(verdict.get("categories") or {}),
        "category_scores": {str(k): float(v) for k, v in scores.items()},
    }


def litellm_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """An agent's reasoning options as LiteLLM's completion() takes them (the runner's
    LiveModel and the service's gateway both call with these): ``reasoning_effort`` as
    named, ``off`` as LiteLLM's ``none``; the deprecated ``reasoning_budget`` as Anthropic's
    and Gemini's thinking budget."""
    extra: dict[str, Any] = {}
    effort = options.get("reasoning_effort")
    if effort:
        extra["reasoning_effort"] = "none" if effort == "off" else effort
    budget = options.get("reasoning_budget")
    if budget:
        extra["thinking"] = {"type": "enabled", "budget_tokens": int(budget)}
    return extra


def litellm_response_format(
    litellm: Any,
    model: str,
    tools: list[dict[str, Any]],
    response_format: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The agent's output_schema as LiteLLM's completion() takes it (the runner's LiveModel
    and the service's gateway both call with this): ``{"response_format": ...}`` on every
    request, tools offered or not, but one: where LiteLLM would map it to its JSON tool and
    force that tool (Claude models before native structured output, e.g. Sonnet 4 or Opus
    4.1), a request that offers the agent's own tools goes without it, since the forced tool
    would leave the model no way to call them. The final answer is still checked against
    the schema (runtime.output_schema)."""
    if not response_format:
        return {}
    shape = dict(response_format)
    if tools:
        try:
            from litellm.utils import get_optional_params

            resolved, provider, _, _ = litellm.get_llm_provider(model)
            mapped = get_optional_params(
                model=resolved,
                custom_llm_provider=provider,
                response_format=shape,
                tools=tools,
            )
            forced = mapped.get("tool_choice")
            if isinstance(forced, dict) and forced.get("name") == "json_tool_call":
                return {}
        except Exception:  # LiteLLM's own call says what is wrong, if anything is
            pass
    return {"response_format": shape}


def litellm_moderation(response: Any) -> dict[str, Any]:
    """LiteLLM's moderation answer (OpenAI's shape) as ``{"flagged", "categories",
    "category_scores"}`` of its first result; ValueError when it has none. The runner's
    LiveModel and the service's gateway both read moderations with this."""
    raw = response.model_dump() if hasattr(response, "model_dump") else response
    try:
        first = raw["results"][0]
        categories = {str(k): bool(v) for k, v in (first.get("categories") or {}).items()}
        scores = {
            str(k): float(v)
            for k, v in (first.get("category_scores") or {}).items()
            if v is not None
        }
        flagged = bool(first["flagged"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise ValueError("the provider's moderation answer has no result") from None
    return {"flagged": flagged, "categories": categories, "category_scores": scores}


def litellm_reply(response: Any) -> dict[str, Any]:
    """A LiteLLM completion as parse_reply reads it (and a recording stores it): the text,
    the tool calls (arguments a JSON string) and the token counts when the provider gave
    them. The runner's LiveModel and
    the service's model gateway both read LiteLLM's answers with this."""
    message = response.choices[0].message
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments or "{}"}
        for c in (getattr(message, "tool_calls", None) or [])
    ]
    reply: dict[str, Any] = {"content": message.content}
    if calls:
        reply["tool_calls"] = calls
    usage = getattr(response, "usage", None)
    if usage is not None:
        reply["usage"] = {
            "prompt_tokens": int(getattr(usage, "prompt_tokens", 0) or 0),
            "completion_tokens": int(getattr(usage, "completion_tokens", 0) or 0),
        }
    return reply


class LiveModel:
    """A real provider through LiteLLM, which understands `provider/model` names as they are.

    For `gate record` on a developer's machine, where LiteLLM is installed; never in a case
    container, whose image has no provider library (live cases use GatewayModel). LiteLLM is
    imported only here: it costs seconds that scripted and replay runs never pay. Keys and
    endpoints come from the environment (OPENAI_API_KEY, OPENAI_API_BASE, ...).
    """

    mode = "live"

    def __init__(self, *, attempts: int = 3, timeout_s: float | None = None) -> None:
        # Never fetch the model cost map from the internet at import time.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.suppress_debug_info = True
        self._litellm = litellm
        self.attempts = max(1, attempts)
        self.timeout_s = timeout_s or float(os.environ.get("GATE_MODEL_TIMEOUT_SECONDS", "60"))

    def raw_completion(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        options: Mapping[str, Any] | None = None,
        attempts: int | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        try:
            response = self._litellm.completion(
                model=model,
                messages=messages,
                tools=tools or None,
                temperature=temperature,
                timeout=self.timeout_s,
                # The library's own retry (its backoff, its Retry-After handling); the first
                # attempt counts, as retry_options.attempts does.
                num_retries=(attempts or self.attempts) - 1,
                **litellm_options(options or {}),
                # As the gateway: an option LiteLLM's map says a model refuses is dropped.
                **({"drop_params": True} if options else {}),
                # The output_schema, as the gateway sends it (LiteLLM maps it per provider).
                **litellm_response_format(self._litellm, model, tools, response_format),
            )
        except Exception as exc:
            raise AgentRunError(
                f"model call to {model} failed: {type(exc).__name__}: {exc}"
            ) from None
        return litellm_reply(response)

    def moderate(self, text: str, model: str) -> dict[str, Any]:
        """A moderation guardrail's check at OpenAI (keys from the environment)."""
        try:
            verdict = {
                "moderation": litellm_moderation(self._litellm.moderation(input=text, model=model))
            }
        except Exception as exc:
            raise AgentRunError(
                f"moderation call to {model} failed: {type(exc).__name__}: {exc}"
            ) from None
        self.record_moderation(text, model, verdict)
        return moderation_verdict(verdict, source=f"live moderation by {model}")

    def record_moderation(self, text: str, model: str, verdict: dict[str, Any]) -> None:
        """Nothing for a live model; RecordingModel writes it."""

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        context: dict[str, Any],
        options: Mapping[str, Any] | None = None,
        attempts: int | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> ModelReply:
        raw = self.raw_completion(
            model=model,
            messages=messages,
            tools=tools,
            temperature=temperature,
            options=options,
            attempts=attempts,
            response_format=response_format,
        )
        return parse_reply(raw, source=f"live model {model}")


def recording(key: str, request: Any, raw: Any) -> tuple[str, dict[str, Any]]:
    """One exchange as a recording: its file name in the agent's recordings folder, and the
    document ReplayModel reads (it finds the answer by ``key``; ``request`` is for people)."""
    return f"{key[:24]}.json", {"key": key, "request": request, "response": raw}


def write_recording(directory: Path, key: str, request: Any, raw: Any) -> Path:
    """One exchange under its replay key in ``directory``, as ReplayModel reads it."""
    name, document = recording(key, request, raw)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    return path


class RecordingModel(LiveModel):
    """Live, and every exchange written to tests/recordings/<agent>/ for later replay."""

    mode = "record"

    def __init__(self, directory: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.directory = directory

    def raw_completion(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        options: Mapping[str, Any] | None = None,
        attempts: int | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The live answer, also written under the replay key of the whole request."""
        raw = super().raw_completion(
            model=model,
            messages=messages,
            tools=tools,
            temperature=temperature,
            options=options,
            attempts=attempts,
            response_format=response_format,
        )
        shape = dict(response_format) if response_format else None
        request = wire.replay_request(
            model, messages, tools, temperature, dict(options or {}), shape
        )
        write_recording(self.directory, request_key(request), request, raw)
        return raw

    def record_moderation(self, text: str, model: str, verdict: dict[str, Any]) -> None:
        request = wire.ModerationRequest(model=model, input=text).replay_request()
        write_recording(self.directory, request_key(request), request, verdict)


@dataclass(frozen=True)
class GatewayChannel:
    """This case's channel to its worker's model gateway (gateway_wire.py): the socket, and
    the token that only this channel accepts (from the handoff, case_env.py)."""

    token: str = field(repr=False)  # never in a repr, a traceback or a span
    socket_path: str = wire.SOCKET_PATH


def _connect(path: str, timeout: float) -> socket.socket:
    """A connection to the gateway's Unix socket: a case has no network to speak TCP on."""
    # A Unix socket's connect with a timeout fails at once while the listen backlog is full
    # (EAGAIN): the channel bounds its connections, and the case's own code may be flooding
    # it. Nothing was sent, so trying again is safe, for a few seconds at most.
    give_up = time.monotonic() + CONNECT_RETRY_SECONDS
    pause = 0.005
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except BlockingIOError:
            sock.close()
            if time.monotonic() + pause > give_up:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
            continue
        except BaseException:
            sock.close()
            raise
        return sock


class GatewayHungUp(OSError):
    """An answer that is not the gateway's: the connection ended before its head did, or its
    head is not an HTTP answer's."""


# What an answer's status line and headers may take: the gateway's are a few lines
# (channel.py); more is not an answer of it.
MAX_ANSWER_HEAD_BYTES = 16 * 1024


def _post(sock: socket.socket, path: str, body: bytes, token: str) -> tuple[int, bytes, bool]:
    """One request on ``sock`` and the gateway's answer: its status, its body (up to
    MAX_REPLY_BYTES + 1) and whether that body is over MAX_REPLY_BYTES (then not all read).

    The wire is the gateway's own (channel.py): it reads one HTTP/1.1 request a connection
    and answers in HTTP/1.0 with a Content-Length, then closes. So the answer is read to the
    connection's end, bounded, with no HTTP library: importing http.client (with the email
    parser and ssl it imports) was about 24 ms of CPU, a fifth of what a live case's runner
    took before its first call.
    """
    head = (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    sock.sendall(head.encode("latin-1") + body)
    data = bytearray()
    limit = MAX_ANSWER_HEAD_BYTES
    split = -1
    declared: int | None = None
    while True:
        chunk = sock.recv(64 * 1024)
        if not chunk:
            break
        data += chunk
        if split < 0:
            # Only where the head's end can be that was not looked at before.
            split = data.find(b"\r\n\r\n", max(0, len(data) - len(chunk) - 3))
            if (split < 0 and len(data) > MAX_ANSWER_HEAD_BYTES) or split > MAX_ANSWER_HEAD_BYTES:
                raise GatewayHungUp(f"the answer's head is over {MAX_ANSWER_HEAD_BYTES} bytes")
            if split < 0:
                continue
            status, declared = _answer_head(bytes(data[:split]))
            if declared is not None and declared > wire.MAX_REPLY_BYTES:
                return status, b"", True  # not read at all: the cap is on what the runner holds
            limit = split + 4 + (wire.MAX_REPLY_BYTES + 1 if declared is None else declared)
        if len(data) >= limit:
            break
    if split < 0:
        raise GatewayHungUp("the gateway closed the connection without an answer")
    reply = bytes(data[split + 4 : limit])
    return status, reply, len(reply) > wire.MAX_REPLY_BYTES


def _answer_head(head: bytes) -> tuple[int, int | None]:
    """An answer head's status and its Content-Length (None: not given)."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    # isascii: str.isdigit takes digits int() does not, such as latin-1's superscripts.
    if not version.startswith("HTTP/") or len(code) != 3 or not (code.isascii() and code.isdigit()):
        raise GatewayHungUp(f"the answer's status line is not HTTP: {lines[0][:80]!r}")
    declared = None
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon and name.strip().lower() == "content-length":
            value = value.strip()
            if not (value.isascii() and value.isdigit()):
                raise GatewayHungUp(f"the answer's Content-Length is not a number: {value[:40]!r}")
            declared = int(value)
    return int(code), declared


# How long the runner keeps trying to connect to a channel whose backlog is full.
CONNECT_RETRY_SECONDS = 10.0


# How long past its attempts' own timeouts the runner waits for the gateway's answer: the
# gateway's waits between retries (Retry-After) and its own work. The gateway keeps every
# call within the gate's deadline, and the invocation's timeout_s bounds it all anyway.
GATEWAY_SLACK_SECONDS = 30.0


class GatewayModel:
    """A live model through the case's model gateway: the runner holds no provider library
    and no key. One request a connection (gateway_wire.py). The gateway retries as the
    agent's retry_options allow (``attempts`` in the request), so this never retries on top.
    With ``record_to`` it is record mode: every answer is also written as a recording.
    """

    def __init__(
        self,
        channel: GatewayChannel,
        *,
        agent: str,
        attempts: int = 3,
        timeout_s: float | None = None,
        record_to: Path | None = None,
    ) -> None:
        self.channel = channel
        self.agent = agent
        self.attempts = max(1, attempts)
        self.timeout_s = timeout_s or float(os.environ.get("GATE_MODEL_TIMEOUT_SECONDS", "60"))
        self.record_to = record_to
        self.mode = "live" if record_to is None else "record"

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        context: dict[str, Any],
        options: Mapping[str, Any] | None = None,
        attempts: int | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> ModelReply:
        request = wire.CompletionRequest(
            model=model,
            messages=messages,
            tools=tools,
            temperature=temperature,
            agent=self.agent,
            attempts=max(1, attempts or self.attempts),
            timeout_s=self.timeout_s,
            options=dict(options or {}),
            response_format=dict(response_format) if response_format else None,
        )
        data = self._exchange(wire.COMPLETE_PATH, request.to_json(), model)
        reply = _completion_reply(model, data)
        raw = reply.raw()
        if self.record_to is not None:
            replayed = request.replay_request()
            key = request_key(replayed)
            if reply.request_hash != key:
                # Written under the gateway's hash, it would never be found by ReplayModel.
                raise AgentRunError(
                    f"model call to {model}: the gateway's request hash "
                    f"{reply.request_hash[:16]} is not the replay key {key[:16]}; "
                    "the recording would not replay"
                )
            write_recording(self.record_to, key, replayed, raw)
        parsed = parse_reply(raw, source=f"live model {model}")
        return dataclasses.replace(
            parsed,
            span_metadata={
                "request_hash": reply.request_hash,
                "tokens_in": int(reply.usage.get("prompt_tokens", 0)),
                "tokens_out": int(reply.usage.get("completion_tokens", 0)),
                "cost_usd": reply.cost_usd,
                "latency_ms": reply.latency_ms,
                "attempts": reply.attempts,
            },
        )

    def moderate(self, text: str, model: str) -> dict[str, Any]:
        """A moderation guardrail's check through the gateway (written as a recording in
        record mode); its errors are the run's, as a model call's."""
        request = wire.ModerationRequest(
            model=model, input=text, agent=self.agent, attempts=self.attempts,
            timeout_s=self.timeout_s,
        )  # fmt: skip
        data = self._exchange(wire.MODERATE_PATH, request.to_json(), f"moderation {model}")
        try:
            doc = json.loads(data)
            raw = {"moderation": {k: doc[k] for k in ("flagged", "categories", "category_scores")}}
        except (ValueError, KeyError, TypeError):
            raise ModelCallError(
                f"moderation call to {model} failed: the model gateway's reply is not a "
                "moderation verdict",
                {"error_kind": "bad_reply"},
            ) from None
        verdict = moderation_verdict(raw, source=f"the model gateway's moderation by {model}")
        if self.record_to is not None:
            replayed = request.replay_request()
            write_recording(self.record_to, request_key(replayed), replayed, raw)
        return verdict

    def fetch(self, url: str, follow_redirects: bool = True) -> dict[str, Any]:
        """A page through the gateway, when its host is on the project's egress allowlist
        (written as a recording in record mode); FetchReply.raw()["fetch"]."""
        request = wire.FetchRequest(url=url, follow_redirects=follow_redirects, agent=self.agent)
        data = self._exchange(wire.FETCH_PATH, request.to_json(), f"page {url}")
        try:
            doc = json.loads(data)
            fetched = {k: doc[k] for k in ("url", "status", "text", "redirect_url")}
        except (ValueError, KeyError, TypeError):
            raise ModelCallError(
                f"web_read_page {url}: the model gateway's reply is not a page",
                {"error_kind": "bad_reply"},
            ) from None
        if self.record_to is not None:
            replayed = request.replay_request()
            write_recording(self.record_to, request_key(replayed), replayed, {"fetch": fetched})
        return fetched

    def api(self, request: wire.ApiRequest) -> dict[str, Any]:
        """An api: tool's call through the gateway (written as a recording in record mode)."""
        request = dataclasses.replace(request, agent=self.agent)
        what = f"api:{request.api}.{request.tool}"
        data = self._exchange(wire.API_PATH, request.to_json(), what)
        try:
            doc = json.loads(data)
            answer = api_answer(
                {"status": doc["status"], "body": doc["body"]}, source=f"the gateway's {what}"
            )
        except (ValueError, KeyError, TypeError, AttributeError, AgentRunError):
            raise ModelCallError(
                f"{what}: the model gateway's reply is not an API answer",
                {"error_kind": "bad_reply"},
            ) from None
        if self.record_to is not None:
            replayed = request.replay_request()
            write_recording(self.record_to, request_key(replayed), replayed, {"api": answer})
        return answer

    def mcp(self, request: wire.McpRequest) -> dict[str, Any]:
        """An MCP list or call through the gateway, when the server's host is on the
        project's egress allowlist (written as a recording in record mode)."""
        request = dataclasses.replace(request, agent=self.agent)
        what = f"MCP server {request.server}"
        data = self._exchange(wire.MCP_PATH, request.to_json(), what)
        try:
            doc = json.loads(data)
            raw = (
                {"tools": doc["tools"]}
                if doc.get("tools") is not None
                else {"result": doc["result"]}
            )
            answer = mcp_answer(raw, source=f"the model gateway's answer for {what}")
        except (ValueError, KeyError, TypeError, AttributeError, AgentRunError):
            raise ModelCallError(
                f"{what}: the model gateway's reply is not an MCP answer",
                {"error_kind": "bad_reply"},
            ) from None
        if self.record_to is not None:
            replayed = request.replay_request()
            write_recording(self.record_to, request_key(replayed), replayed, {"mcp": answer})
        return answer

    def _exchange(self, path: str, body: bytes, model: str) -> bytes:
        """One POST to the gateway and its 200's body, or the error the agent's run fails
        with."""
        if len(body) > wire.MAX_REQUEST_BYTES:
            raise ModelCallError(
                f"model call to {model} failed: the request takes {len(body)} bytes, over "
                f"the model gateway's {wire.MAX_REQUEST_BYTES}",
                {"error_kind": "bad_request"},
            )
        wait = self.attempts * (self.timeout_s + GATEWAY_SLACK_SECONDS)
        try:
            sock = _connect(self.channel.socket_path, wait)
            try:
                status, data, oversized = _post(sock, path, body, self.channel.token)
            finally:
                sock.close()
        except TimeoutError:
            raise self._unreachable(model, f"it did not answer within {wait:.0f} s") from None
        except OSError as exc:
            raise self._unreachable(model, f"{type(exc).__name__}: {exc}") from None
        if oversized:
            raise ModelCallError(
                f"model call to {model} failed: the model gateway's reply is over "
                f"{wire.MAX_REPLY_BYTES} bytes",
                {"error_kind": "reply_too_large"},
            )
        if status == 200:
            return data
        raise _gateway_error(model, status, data)

    def _unreachable(self, model: str, why: str) -> ModelCallError:
        return ModelCallError(
            f"model call to {model} failed: the model gateway is unreachable at "
            f"{self.channel.socket_path} ({why})",
            {"error_kind": "unreachable"},
        )


def _completion_reply(model: str, data: bytes) -> wire.CompletionReply:
    """A 200's body as a CompletionReply, each field checked: the gateway is another process."""

    def bad(why: str) -> ModelCallError:
        return ModelCallError(
            f"model call to {model} failed: the model gateway's reply is not a completion ({why})",
            {"error_kind": "bad_reply"},
        )

    try:
        doc = json.loads(data)
    except ValueError:
        raise bad("not JSON") from None
    if not isinstance(doc, dict):
        raise bad("not an object")
    content = doc.get("content")
    tool_calls = doc.get("tool_calls") or []
    usage = doc.get("usage") or {}
    numbers = (int, float)
    if content is not None and not isinstance(content, str):
        raise bad("content is not a string")
    if not isinstance(tool_calls, list) or not all(isinstance(c, dict) for c in tool_calls):
        raise bad("tool_calls is not a list of objects")
    if not isinstance(usage, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in usage.values()
    ):
        raise bad("usage is not an object of token counts")
    for name, kind in (("cost_usd", numbers), ("latency_ms", int), ("attempts", int)):
        value = doc.get(name)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise bad(f"{name} is not a number")
    if not isinstance(doc.get("request_hash"), str):
        raise bad("request_hash is not a string")
    return wire.CompletionReply(
        content=content,
        tool_calls=tool_calls,
        usage=usage,
        cost_usd=float(doc["cost_usd"]),
        latency_ms=int(doc["latency_ms"]),
        request_hash=doc["request_hash"],
        attempts=int(doc["attempts"]),
    )


def _gateway_error(model: str, status: int, data: bytes) -> ModelCallError:
    """An error status's ``{"error": GatewayError}`` as the agent's model error."""
    try:
        doc = json.loads(data)
        fields = doc["error"]
        error = wire.GatewayError(
            kind=fields["kind"],
            message=str(fields["message"]),
            limit=fields.get("limit"),
            allowed=fields.get("allowed"),
            used=fields.get("used"),
            provider_status=fields.get("provider_status"),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return ModelCallError(
            f"model call to {model} failed: the model gateway answered HTTP {status} "
            f"without an error document: {data[:200]!r}",
            {"error_kind": "bad_reply", "status": status},
        )
    metadata: dict[str, Any] = {"error_kind": error.kind}
    if error.kind not in wire.ERROR_STATUS:
        metadata["status"] = status  # a kind this runner does not know: the status tells
    if error.kind == "budget":
        metadata.update(limit=error.limit, allowed=error.allowed, used=error.used)
    status_answered = error.provider_status
    if isinstance(status_answered, int) and not isinstance(status_answered, bool):
        metadata["provider_status"] = status_answered
    return ModelCallError(f"model call to {model} failed: {error.message}", metadata)


MODES = ("scripted", "replay", "live", "record")


def choose_model(
    project: Path,
    agent: str,
    forced: str | None = None,
    *,
    attempts: int = 3,
    gateway: GatewayChannel | None = None,
    retries: Callable[[BaseException], bool] | None = None,
) -> Model:
    """``retries``: a scripted model's retry rule (see ScriptedModel)."""
    scripted = project / "tests" / "models" / f"{agent}.py"
    recordings = project / "tests" / "recordings" / agent
    if forced and forced not in MODES:
        raise AgentRunError(f"unknown model mode {forced!r} (known: {', '.join(MODES)})")
    mode = forced or (
        "scripted" if scripted.is_file() else "replay" if recordings.is_dir() else "live"
    )
    if mode == "scripted":
        if not scripted.is_file():
            raise AgentRunError(f"model mode scripted, but tests/models/{agent}.py does not exist")
        return ScriptedModel(scripted, agent, attempts=attempts, retries=retries)
    if mode == "replay":
        if not recordings.is_dir():
            raise AgentRunError(f"model mode replay, but tests/recordings/{agent}/ does not exist")
        return ReplayModel(recordings)
    if gateway is not None:
        return GatewayModel(
            gateway,
            agent=agent,
            attempts=attempts,
            record_to=recordings if mode == "record" else None,
        )
    # No gateway channel: LiteLLM in this process, with keys from the environment. Only
    # where LiteLLM is installed: `gate record` on a developer's machine (the service
    # package depends on it). The runner image carries no provider library, so in a case
    # without a channel (GATE_MODEL_GATEWAY off) live mode fails here, saying why.
    try:
        if mode == "record":
            return RecordingModel(recordings, attempts=attempts)
        return LiveModel(attempts=attempts)
    except ImportError:
        raise AgentRunError(
            f"agent {agent!r} needs a live model ({mode} mode), and no model gateway serves "
            f"this case (the worker's GATE_MODEL_GATEWAY is off; the runner image carries no "
            f"provider library); turn the gateway on, or add tests/models/{agent}.py "
            f"(scripted) or tests/recordings/{agent}/ (replay)"
        ) from None

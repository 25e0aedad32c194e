"""Models for LLM agents, chosen per agent: scripted, replay or live (spec: runner models).

- scripted: ``tests/models/<agent>.py`` exposes ``respond(messages, tools, context)`` and
  answers like a model, for deterministic orchestration tests;
- replay: ``tests/recordings/<agent>/*.json`` hold recorded exchanges keyed by the whole
  request (model, messages, tools, temperature and the other parameters);
- live: LiteLLM with keys from the gate's environment; `record` is live plus writing every
  exchange as a recording.

Default: scripted if the module exists, else replay if recordings exist, else live.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from .runtime_errors import AgentRunError


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


class Model(Protocol):
    mode: str

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        context: dict[str, Any],
    ) -> ModelReply: ...


def request_key(request: Mapping[str, Any]) -> str:
    """The replay key: a hash of the canonical JSON of the whole request."""
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
    mode = "scripted"

    def __init__(self, path: Path, agent: str) -> None:
        self.source = f"tests/models/{path.name}"
        module = _load_module(path, f"gate_scripted_model_{agent.replace('-', '_')}")
        respond = getattr(module, "respond", None)
        if not callable(respond):
            raise AgentRunError(f"{self.source} must define respond(messages, tools, context)")
        self._respond = respond

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        context: dict[str, Any],
    ) -> ModelReply:
        # The script sees copies: it cannot rewrite the conversation the trace records.
        raw = self._respond(
            json.loads(json.dumps(messages, default=str)), json.loads(json.dumps(tools)), context
        )
        return parse_reply(raw, source=f"{self.source} respond()")


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
    ) -> ModelReply:
        request = {"model": model, "messages": messages, "tools": tools, "temperature": temperature}
        key = request_key(request)
        if key not in self.recordings:
            last = messages[-1] if messages else {}
            raise AgentRunError(
                f"no recording for this request (key {key[:16]}, model {model}, "
                f"{len(messages)} message(s), last {last.get('role')}: "
                f"{str(last.get('content'))[:120]!r}); record it again with `gate record`"
            )
        return parse_reply(self.recordings[key], source=f"recording {key[:16]}")


class LiveModel:
    """A real provider through LiteLLM, which understands `provider/model` names as they are.

    LiteLLM is imported only here: it costs seconds that scripted and replay runs never pay.
    Keys and endpoints come from the environment (OPENAI_API_KEY, OPENAI_API_BASE, ...).
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
                num_retries=self.attempts - 1,
            )
        except Exception as exc:
            raise AgentRunError(
                f"model call to {model} failed: {type(exc).__name__}: {exc}"
            ) from None
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

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        temperature: float,
        context: dict[str, Any],
    ) -> ModelReply:
        raw = self.raw_completion(
            model=model, messages=messages, tools=tools, temperature=temperature
        )
        return parse_reply(raw, source=f"live model {model}")


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
    ) -> dict[str, Any]:
        """The live answer, also written under the replay key of the whole request."""
        raw = super().raw_completion(
            model=model, messages=messages, tools=tools, temperature=temperature
        )
        request = {"model": model, "messages": messages, "tools": tools, "temperature": temperature}
        key = request_key(request)
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {"key": key, "request": request, "response": raw}
        (self.directory / f"{key[:24]}.json").write_text(
            json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8"
        )
        return raw


MODES = ("scripted", "replay", "live", "record")


def choose_model(
    project: Path, agent: str, forced: str | None = None, *, attempts: int = 3
) -> Model:
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
        return ScriptedModel(scripted, agent)
    if mode == "replay":
        if not recordings.is_dir():
            raise AgentRunError(f"model mode replay, but tests/recordings/{agent}/ does not exist")
        return ReplayModel(recordings)
    if mode == "record":
        return RecordingModel(recordings, attempts=attempts)
    try:
        return LiveModel(attempts=attempts)
    except ImportError:
        raise AgentRunError(
            f"agent {agent!r} needs a live model, and LiteLLM is not installed here; add "
            f"tests/models/{agent}.py (scripted) or tests/recordings/{agent}/ (replay)"
        ) from None

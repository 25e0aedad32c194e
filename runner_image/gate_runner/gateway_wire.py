"""The model gateway's wire: how a case's runner asks its worker's gateway for one completion.

A live case has no network. Its worker serves a model gateway (gate_service/gateway), and
gives each case a channel of its own: a Unix socket in a host folder that the sandbox
delivers to that case's container alone, at ``SOCKET_DIR`` (the Docker backend bind-mounts
it read-only; docs/threat-model.md),
and a token that only this channel accepts, handed to the runner on its stdin
with the case's environment (gate_runner/case_env.py). The gateway holds the provider keys,
the budgets and the record of every call; the runner holds none of them.

One request a connection: ``POST COMPLETE_PATH`` with ``Authorization: Bearer <token>`` and a
``CompletionRequest`` as JSON. The answer is ``200`` with a ``CompletionReply``, or an error
status with ``{"error": GatewayError}``. Each error kind is a model error to the agent (its
``message`` says what happened, and for ``budget`` which limit and how much was used).

May import the standard library only, and never ``gate_service``: the runner loads this.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

SOCKET_DIR: Final = "/run/gate-model"  # in the case container, read-only
SOCKET_NAME: Final = "model.sock"
SOCKET_PATH: Final = f"{SOCKET_DIR}/{SOCKET_NAME}"
COMPLETE_PATH: Final = "/v1/complete"
# A provider-backed guardrail's check (spec 4.3 `moderation`): a ModerationRequest, answered
# with a ModerationReply, its errors as a completion's.
MODERATE_PATH: Final = "/v1/moderate"
DEFAULT_MODERATION_MODEL: Final = "omni-moderation-latest"
# A web_read_page of the case's code (spec 3.2): a FetchRequest, fetched by the gateway when
# the URL's host is on the project's egress allowlist, answered with a FetchReply.
FETCH_PATH: Final = "/v1/fetch"
MAX_PAGE_CHARS: Final = 100_000
# An MCP server's tools (spec 3.3, remote Streamable HTTP): an McpRequest that lists them or
# calls one, which the gateway makes with the mcp SDK's client when the server's host is on
# the project's egress allowlist, answered with an McpReply.
MCP_PATH: Final = "/v1/mcp"
MCP_OPS: Final = ("list", "call")
# An `api:` tool's call (spec 3.3): an ApiRequest naming the project's spec prefix, the tool
# and its arguments; the gateway builds the HTTP request from the spec the project stored
# (the case cannot point it elsewhere) and answers an ApiReply.
API_PATH: Final = "/v1/api"
MAX_API_BODY_CHARS: Final = 200_000
# A request carries the whole conversation so far; an answer, one message.
MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
MAX_REPLY_BYTES: Final = 8 * 1024 * 1024

ErrorKind = Literal[
    "refused",  # no or wrong token, or the channel's case is over: nothing was forwarded
    "bad_request",  # not a CompletionRequest, or over MAX_REQUEST_BYTES
    "budget",  # a gate or project limit (calls, tokens, cost, concurrent calls) is reached
    "provider",  # the provider answered an error, after the retries the agent allows
    "rate_limited",  # the provider's 429, after the retries the agent allows
    "deadline",  # the gate's deadline comes before an answer (or a retry) could
    "no_route",  # no key or route for this model's provider among the project's secrets
]
ERROR_STATUS: Final[dict[str, int]] = {
    "refused": 403,
    "bad_request": 400,
    "budget": 429,
    "provider": 502,
    "rate_limited": 503,
    "deadline": 504,
    "no_route": 424,
}


# The model options an agent may set (SDK AgentConfig), as the wire carries them.
REASONING_EFFORTS: Final = ("off", "minimal", "low", "medium", "high", "xhigh")
OPTION_KEYS: Final = ("reasoning_effort", "reasoning_budget")
# An LLM agent's output_schema as OpenAI's response_format ({"type": "json_schema",
# "json_schema": {"name", "schema", "strict"}}), which LiteLLM maps for each provider; at most
# this many bytes of JSON.
MAX_RESPONSE_FORMAT_BYTES: Final = 256 * 1024


def replay_request(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    temperature: float,
    options: dict[str, Any] | None = None,
    response_format: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a completion's replay key is computed over (gate_runner.models.request_key).
    Options are in it only when the agent set one, and the response format only when the
    agent has an output_schema, so recordings made before either existed keep their keys."""
    request: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "tools": tools,
        "temperature": temperature,
    }
    if options:
        request["options"] = dict(options)
    if response_format:
        request["response_format"] = dict(response_format)
    return request


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest:
    """What the agent asks its model: the fields the replay key is computed over, and how
    hard to try. ``replay_request()`` is exactly what gate_runner.models.request_key hashes,
    so a recorded call replays under the key the runner looks it up by."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    temperature: float = 0.0
    agent: str = ""
    # retry_options.attempts: the first try counts, so at most attempts - 1 retries.
    attempts: int = 1
    timeout_s: float = 60.0  # one attempt's
    # reasoning_effort (one of REASONING_EFFORTS), reasoning_budget (tokens): as the agent
    # set them; empty when it set none ("auto" is no option).
    options: dict[str, Any] = field(default_factory=dict)
    # The agent's output_schema as OpenAI's response_format (MAX_RESPONSE_FORMAT_BYTES at
    # most); None when it has none.
    response_format: dict[str, Any] | None = None

    def replay_request(self) -> dict[str, Any]:
        return replay_request(
            self.model, self.messages, self.tools, self.temperature, self.options,
            self.response_format,
        )  # fmt: skip

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), default=str).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionReply:
    """One answer, in the shape gate_runner.models.parse_reply reads, with what it cost."""

    content: str | None
    tool_calls: list[dict[str, Any]]  # {"id", "name", "arguments"}, arguments a JSON string
    usage: dict[str, int]  # {"prompt_tokens", "completion_tokens"}
    cost_usd: float
    latency_ms: int
    request_hash: str  # the replay key (gate_runner.models.request_key) of the request
    attempts: int  # how many tries the gateway made, retries included

    def raw(self) -> dict[str, Any]:
        """The reply as a recording stores it and parse_reply accepts it."""
        reply: dict[str, Any] = {"content": self.content, "usage": dict(self.usage)}
        if self.tool_calls:
            reply["tool_calls"] = list(self.tool_calls)
        return reply

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModerationRequest:
    """A ``moderation`` guardrail's text for the provider's moderation endpoint (OpenAI's,
    through LiteLLM). ``replay_request()`` is what the replay key is computed over."""

    model: str
    input: str
    agent: str = ""
    attempts: int = 1
    timeout_s: float = 60.0

    def replay_request(self) -> dict[str, Any]:
        return {"moderation": {"model": self.model, "input": self.input}}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModerationReply:
    """The provider's verdict on one text: OpenAI's ``results[0]`` fields."""

    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]
    latency_ms: int
    request_hash: str
    attempts: int
    cost_usd: float = 0.0

    def raw(self) -> dict[str, Any]:
        """As a recording stores it (gate_runner.guardrails reads it back)."""
        return {
            "moderation": {
                "flagged": self.flagged,
                "categories": dict(self.categories),
                "category_scores": dict(self.category_scores),
            }
        }

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchRequest:
    """A page the case's code reads; ``replay_request()`` is what its replay key covers."""

    url: str
    follow_redirects: bool = True
    agent: str = ""
    attempts: int = 1
    timeout_s: float = 20.0

    def replay_request(self) -> dict[str, Any]:
        return {"fetch": {"url": self.url, "follow_redirects": self.follow_redirects}}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchReply:
    """The page as web_read_page answers it: its final URL, HTTP status and text (HTML
    flattened, at most MAX_PAGE_CHARS), or the redirect it was not allowed to follow."""

    url: str
    status: int
    text: str
    redirect_url: str | None
    latency_ms: int
    request_hash: str
    attempts: int
    cost_usd: float = 0.0

    def raw(self) -> dict[str, Any]:
        return {
            "fetch": {
                "url": self.url,
                "status": self.status,
                "text": self.text,
                "redirect_url": self.redirect_url,
            }
        }

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class McpRequest:
    """One MCP operation on the case's behalf: ``list`` the server's tools, or ``call`` one.

    ``headers`` are the agent's as written, ``${VAR}`` and ``${context.path}`` unresolved;
    the gateway fills them in one pass, ``${VAR}`` from the project's secrets (never a
    provider key) and ``${context.path}`` from ``context_values``, which the runner resolved
    from the run's context. Neither is in the replay key, which covers what was asked."""

    server: str
    url: str
    op: str = "list"
    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    context_values: dict[str, str] = field(default_factory=dict)
    agent: str = ""
    attempts: int = 1
    timeout_s: float = 30.0

    def replay_request(self) -> dict[str, Any]:
        asked: dict[str, Any] = {"server": self.server, "url": self.url, "op": self.op}
        if self.op == "call":
            asked.update(tool=self.tool, arguments=self.arguments)
        return {"mcp": asked}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), default=str).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class McpReply:
    """For ``list``: the server's tools (``name``, ``description``, ``input_schema``); for
    ``call``: the tool's result, ``is_error`` and its content ``parts`` as the MCP wire
    spells them (``{"type": "text", "text": ...}``, ...)."""

    tools: list[dict[str, Any]] | None
    result: dict[str, Any] | None
    latency_ms: int
    request_hash: str
    attempts: int
    cost_usd: float = 0.0

    def raw(self) -> dict[str, Any]:
        answer = {"tools": self.tools} if self.tools is not None else {"result": self.result}
        return {"mcp": answer}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiRequest:
    """One call of the tool ``api:<api>.<tool>`` with ``arguments``."""

    api: str
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    agent: str = ""
    attempts: int = 1
    timeout_s: float = 30.0

    def replay_request(self) -> dict[str, Any]:
        return {"api": {"api": self.api, "tool": self.tool, "arguments": self.arguments}}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), default=str).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiReply:
    """The operation's HTTP status and its body: parsed JSON when it is JSON, else text (at
    most MAX_API_BODY_CHARS)."""

    status: int
    body: Any
    latency_ms: int
    request_hash: str
    attempts: int
    cost_usd: float = 0.0

    def raw(self) -> dict[str, Any]:
        return {"api": {"status": self.status, "body": self.body}}

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayError:
    kind: ErrorKind
    message: str
    # For kind "budget": the limit's name (e.g. "gate.tokens"), its value and the amount used.
    limit: str | None = None
    allowed: float | None = None
    used: float | None = None
    # For kinds "provider" and "rate_limited": the HTTP status the provider answered, None
    # when no answer came (unreachable, timed out). The runner tells by it whether the
    # failure was the request's (a 400) or the provider's and the gate's (a 401, a 5xx).
    provider_status: int | None = None

    def to_json(self) -> bytes:
        return json.dumps({"error": asdict(self)}).encode()

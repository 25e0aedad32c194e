"""The worker's model gateway: every live call of its cases goes through here to LiteLLM.

One per worker process, built at start-up (never at import: LiteLLM costs seconds to
import, paid once here instead of in every invocation). It owns the budgets of the gates and
projects it serves, and the retries: LiteLLM is called with none of its own, so that the
agent's ``retry_options.attempts``, a provider's ``Retry-After`` and the gate's deadline
decide them together.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from gate_runner.gateway_wire import (
    MAX_API_BODY_CHARS,
    ApiReply,
    ApiRequest,
    CompletionReply,
    CompletionRequest,
    FetchReply,
    FetchRequest,
    McpReply,
    McpRequest,
    ModerationReply,
    ModerationRequest,
)
from gate_runner.models import (
    litellm_moderation,
    litellm_options,
    litellm_reply,
    litellm_response_format,
    request_key,
)
from gate_service.config import Settings
from gate_service.secrets.redact import Redactor

from ..endpoints import host_allowed, refused_address
from .api_call import build_call
from .budget import Budget, BudgetLedger, Budgets, Limits, SpendStore
from .channel import Channel, channel_folder
from .failure import Failure, first_line
from .keys import ModelRoute, Route, provider_secret_names, resolve_route
from .mcp import fill_headers, fill_secrets, mcp_once
from .pages import page_text
from .records import ANSWERED, CallRecord
from .transport import (
    BODY_EXCERPT_BYTES,
    Exchange,
    RefusedAddress,
    guarded_client,
    install_litellm_guard,
    model_client,
    observing,
)

# The longest wait between two tries when the provider names none, and the longest message
# of a provider's error passed back to the agent.
MAX_BACKOFF_S = 30.0
MAX_MESSAGE_CHARS = 2000


class _Retryable(Exception):
    """One failed try that may be tried again."""

    def __init__(self, failure: Failure, retry_after_s: float | None) -> None:
        super().__init__(failure.error.message)
        self.failure = failure
        self.retry_after_s = retry_after_s


E = TypeVar("E", bound=BaseException)
Reply = CompletionReply | ModerationReply | FetchReply | McpReply | ApiReply
Request = CompletionRequest | ModerationRequest | FetchRequest | McpRequest | ApiRequest
MAX_REDIRECTS = 5
MAX_PAGE_BYTES = 2 * 1024 * 1024


def _wrapped(exc: BaseException, kind: type[E]) -> E | None:
    """The ``kind`` error a client library wrapped (``exc`` itself, its cause or context, at
    most ten deep), if any: a RefusedAddress, or the httpx error under a provider's."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None or isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _what(request: Request) -> str:
    """What a call asked, for messages: a model, a page or an MCP server."""
    if isinstance(request, FetchRequest):
        return f"page {request.url}"
    if isinstance(request, McpRequest):
        return f"MCP server {request.server}"
    if isinstance(request, ApiRequest):
        return f"api:{request.api}.{request.tool}"
    return f"model {request.model}"


def _allowed_url(channel: Channel, url: str, asker: str | None = None) -> None:
    """Raise ``Failure("no_route")`` unless ``url`` may be reached for ``channel``'s case
    (``asker``: who asks, for the message; a web_read_page by default)."""
    asker = asker or f"web_read_page {url}"
    problem = refused_address(url)
    if problem is not None:
        raise Failure("no_route", f"{asker}: {problem}")
    host = urlsplit(url).hostname or ""
    if not host_allowed(host, channel.egress):
        raise Failure(
            "no_route",
            f"{asker}: {host} is not on the project's egress allowlist "
            "(PUT /v1/projects/{name}/egress)",
        )


def _retry_after(exc: BaseException) -> float | None:
    """The seconds of a provider's ``Retry-After`` (LiteLLM keeps the HTTP response)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or getattr(exc, "litellm_response_headers", None)
    if not headers:
        return None
    try:
        value = float(headers.get("retry-after", ""))
    except (TypeError, ValueError):
        return None  # absent, or an HTTP date: back off as for any other failure
    return max(0.0, value)


def default_socket_root() -> Path:
    return Path(tempfile.gettempdir()) / "gate-gateway"


# LiteLLM's loggers, as it names them.
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


def quiet_litellm_logs() -> None:
    """LiteLLM's loggers keep their warnings and errors, in the service's log alone.

    At import LiteLLM gives its loggers a stdout handler of its own, in its own format, and
    leaves their level to the root's INFO: every call logged two INFO lines ("LiteLLM
    completion() model= ...", "Wrapper: Completed Call, calling success_handler") on that
    handler and again on the root's, in GATE_LOG_FORMAT, each through LiteLLM's filter that
    scans the message for secrets to redact. Nothing of a call is in them that its record
    does not hold.
    """
    for name in LITELLM_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)


class ModelGateway:
    """Opens channels for cases and forwards their calls through LiteLLM."""

    def __init__(
        self,
        *,
        budgets: Budgets | None = None,
        socket_root: Path | None = None,
        retry_backoff_s: float = 1.0,
        project_spend: SpendStore | None = None,
    ) -> None:
        # LiteLLM is imported at the first call that needs it (``_libraries``), not here:
        # its import takes seconds, and a worker starts (and claims scripted and replay gates,
        # which never call a provider) without waiting for it (issue 43).
        self._libraries_lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None
        # Never fetch the model cost map from the internet at import time. Set here, not at
        # the import: setenv while other threads may read the environment is not safe.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        self.budgets = budgets or Budgets()
        self.socket_root = socket_root or default_socket_root()
        self.retry_backoff_s = retry_backoff_s
        # Where the projects' spending is kept (spend.ProjectSpend: Postgres, shared by every
        # worker process); None: counted in this process only.
        self.project_spend = project_spend
        self._ledger = BudgetLedger()
        self._lock = threading.Lock()
        self._gate_budgets: dict[str, Budget] = {}
        self._project_budgets: dict[str, Budget] = {}

    def _libraries(self) -> tuple[Any, Any]:
        """LiteLLM and openai (LiteLLM's own dependency, the moderation calls' client),
        imported once, guarded, by the first caller; the others wait for it."""
        loaded = self._loaded
        if loaded is not None:
            return loaded
        with self._libraries_lock:
            if self._loaded is None:
                import litellm
                import openai

                litellm.suppress_debug_info = True
                quiet_litellm_logs()
                # Every HTTP client LiteLLM makes for itself refuses redirects and refused
                # addresses too: the per-call client (_client_for) is not taken by every
                # provider's path.
                install_litellm_guard(litellm)
                self._loaded = (litellm, openai)
            return self._loaded

    @property
    def _litellm(self) -> Any:
        return self._libraries()[0]

    @property
    def _openai(self) -> Any:
        return self._libraries()[1]

    def load(self) -> None:
        """Import LiteLLM now (the worker does, validating a gate that calls a model live)."""
        self._libraries()

    @property
    def libraries_loaded(self) -> bool:
        """Whether LiteLLM has been imported (by a call that needed it)."""
        return self._loaded is not None

    @classmethod
    def from_settings(
        cls, settings: Settings, *, project_spend: SpendStore | None = None
    ) -> ModelGateway:
        return cls(
            project_spend=project_spend,
            budgets=Budgets(
                gate=Limits(
                    calls=settings.gateway_gate_max_calls,
                    tokens=settings.gateway_gate_max_tokens,
                    cost_usd=settings.gateway_gate_max_cost_usd,
                    concurrent_calls=settings.gateway_gate_max_concurrent_calls,
                ),
                project=Limits(
                    calls=settings.gateway_project_max_calls,
                    tokens=settings.gateway_project_max_tokens,
                    cost_usd=settings.gateway_project_max_cost_usd,
                    concurrent_calls=settings.gateway_project_max_concurrent_calls,
                ),
                project_window_s=settings.gateway_project_window_seconds,
            ),
            socket_root=settings.gateway_socket_root,
            retry_backoff_s=settings.gateway_retry_backoff_seconds,
        )

    # Channels and budgets

    def open_channel(
        self,
        *,
        gate_id: str,
        case_id: str,
        project_id: str,
        secrets: Mapping[str, str],
        deadline: float,
        routes: Sequence[ModelRoute] = (),
        egress: Sequence[str] = (),
        api_specs: Mapping[str, Any] | None = None,
        budgets: Budgets | None = None,
        waiting: Callable[[], AbstractContextManager[None]] | None = None,
        folder: Path | None = None,
    ) -> Channel:
        """A channel for one case of ``gate_id``, calling with ``project_id``'s ``secrets``
        (name → value) and ``routes``, fetching pages of the ``egress`` hosts, until
        ``deadline`` (a ``time.monotonic()`` instant).

        ``budgets`` (default: the gateway's own) sets the gate's limits when its first
        channel opens and the project's when the project is first seen in this process;
        later channels share those counters. ``waiting``: entered around each call the
        channel forwards (the worker lends the case's CPU slot meanwhile). ``folder``: where
        its socket goes, one that ``case_folder`` made (and removes); default: a folder of
        the channel's own, removed when it closes."""
        chosen = budgets or self.budgets
        with self._lock:
            gate = self._gate_budgets.get(gate_id)
            if gate is None:
                gate = self._gate_budgets[gate_id] = Budget("gate", chosen.gate)
            project = self._project_budgets.get(project_id)
            if project is None:
                project = self._project_budgets[project_id] = Budget(
                    "project",
                    chosen.project,
                    window_s=chosen.project_window_s,
                    store=self.project_spend,
                    owner=project_id,
                )
        return Channel(
            root=self.socket_root,
            gate_id=gate_id,
            case_id=case_id,
            project_id=project_id,
            secrets_=secrets,
            routes=routes,
            egress=egress,
            api_specs=api_specs,
            budgets=(gate, project),
            deadline=deadline,
            complete=self.complete,
            waiting=waiting,
            folder=folder,
        )

    @contextmanager
    def case_folder(self) -> Iterator[Path]:
        """A folder for one case's channel socket, removed on leaving: the worker mounts it
        into the case's container when it creates it, before the channel opens in it."""
        folder = channel_folder(self.socket_root)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def end_gate(self, gate_id: str) -> None:
        """Forget a finished gate's budget (its channels are closed)."""
        with self._lock:
            self._gate_budgets.pop(gate_id, None)

    # One call

    def complete(self, channel: Channel, request: Request) -> CallRecord:
        """Route, budget and forward one call (a completion, a moderation guardrail's check,
        or a page the case's code reads); its record, whether it was answered or not."""
        if isinstance(request, FetchRequest):
            return self._call(
                channel, request, lambda: self._egress(channel, request), self._fetch_once,
                self._fetched,
            )  # fmt: skip
        if isinstance(request, ApiRequest):
            return self._call(channel, request, lambda: None, self._api_once, self._api_answered)
        if isinstance(request, McpRequest):
            asker = f"MCP server {request.server} ({request.url})"
            return self._call(
                channel, request, lambda: _allowed_url(channel, request.url, asker),
                self._mcp_once, self._mcp_answered,
            )  # fmt: skip
        if isinstance(request, ModerationRequest):
            return self._call(
                channel, request, lambda: self._moderation_route(channel, request),
                self._moderate_once, self._moderation,
            )  # fmt: skip
        return self._call(
            channel, request, lambda: self._route(channel, request, request.model), self._try,
            self._completion,
        )  # fmt: skip

    def _route(
        self, channel: Channel, request: CompletionRequest | ModerationRequest, model: str
    ) -> Route:
        route = resolve_route(model, channel.secrets, channel.routes, provider_of=self._provider_of)
        # A route's or a provider secret's endpoint is the project's choice: never one at a
        # link-local address (cloud metadata), checked where the call is made.
        refused = refused_address(route.api_base) if route.api_base else None
        if refused is not None:
            # The endpoint may be a secret's value (OPENAI_API_BASE): never in the message.
            message = f"model {request.model} ({route.via}): {refused}"
            raise Failure("no_route", Redactor(channel.secrets).text(message))
        return route

    def _egress(self, channel: Channel, request: FetchRequest) -> None:
        """A page's URL may be fetched: http(s), its host on the project's egress allowlist,
        not at a link-local address. Each redirect is checked again (_fetch_once)."""
        _allowed_url(channel, request.url)

    def _call(
        self,
        channel: Channel,
        request: Request,
        prepare: Callable[[], Route | None],
        try_once: Callable[..., Any],
        read: Callable[[Any, str, int, float], tuple[Reply, int, int, float]],
    ) -> CallRecord:
        """One call's checks (``prepare``: its route, or why it may not go), budgets, tries
        (``try_once``) and record; ``read`` turns the response into the reply and its tokens
        in and out and cost."""
        started = time.monotonic()
        key = request_key(request.replay_request())
        attempts = 0
        tokens_in = tokens_out = 0
        cost = 0.0
        try:
            route = prepare()
            self._ledger.admit(
                channel.budgets, deadline=channel.deadline, stopped=lambda: channel.closed
            )
            try:
                response, attempts = self._forward(
                    channel,
                    request,
                    lambda timeout, cut: try_once(
                        channel, request, route, timeout, cut_by_deadline=cut
                    ),
                )
                reply, tokens_in, tokens_out, cost = read(response, key, attempts, started)
            finally:
                self._ledger.settle(channel.budgets, tokens=tokens_in + tokens_out, cost_usd=cost)
        except Failure as failure:
            return CallRecord(
                request_hash=key,
                request=request.replay_request(),
                agent=request.agent,
                status=failure.error.kind,
                reply=None,
                error=failure.error,
                attempts=failure.attempts,
                latency_ms=_ms_since(started),
            )
        return CallRecord(
            request_hash=key,
            request=request.replay_request(),
            agent=request.agent,
            status=ANSWERED,
            reply=reply,
            error=None,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost,
            latency_ms=reply.latency_ms,
            attempts=attempts,
        )

    def _fetch_once(
        self,
        channel: Channel,
        request: FetchRequest,
        route: None,
        timeout: float,
        *,
        cut_by_deadline: bool,
    ) -> dict[str, Any]:
        """One fetch of the page, following redirects itself (at most MAX_REDIRECTS) so that
        every hop is checked against the allowlist; at most MAX_PAGE_BYTES are read."""
        url = request.url
        with guarded_client(timeout=timeout) as client:
            for _ in range(MAX_REDIRECTS + 1):
                try:
                    with client.stream("GET", url) as response:
                        if response.is_redirect:
                            target = str(response.next_request.url) if response.next_request else ""
                            if not request.follow_redirects or not target:
                                return {"url": url, "status": response.status_code, "body": b"",
                                        "redirect_url": target or None}  # fmt: skip
                            _allowed_url(channel, target)
                            url = target
                            continue
                        # A bytearray: a server trickling one byte a chunk must not make
                        # the read quadratic.
                        body = bytearray()
                        for chunk in response.iter_bytes():
                            body += chunk
                            if len(body) >= MAX_PAGE_BYTES:
                                break
                        page = bytes(body[:MAX_PAGE_BYTES])
                        return {"url": url, "status": response.status_code, "body": page,
                                "redirect_url": None}  # fmt: skip
                except httpx.TimeoutException:
                    if cut_by_deadline:
                        raise Failure(
                            "deadline", f"the gate's deadline came before {url} answered"
                        ) from None
                    raise _Retryable(
                        Failure("provider", f"{url} did not answer in time"), None
                    ) from None
                except RefusedAddress as exc:
                    raise Failure("no_route", f"web_read_page {url}: {exc}") from None
                except httpx.HTTPError as exc:
                    message = f"{url} could not be reached: {first_line(str(exc)) or 'no answer'}"
                    raise _Retryable(Failure("provider", message), None) from None
        raise Failure("provider", f"{request.url}: more than {MAX_REDIRECTS} redirects")

    def _mcp_once(
        self,
        channel: Channel,
        request: McpRequest,
        route: None,
        timeout: float,
        *,
        cut_by_deadline: bool,
    ) -> dict[str, Any]:
        """One MCP session (gateway/mcp.py). Never retried: spec 3.3 has a tool's errors go
        back to the model, with no blind retries."""
        withheld = provider_secret_names() | {r.key_secret for r in channel.routes if r.key_secret}
        headers = fill_headers(request, channel.secrets, withheld)
        try:
            return mcp_once(request, headers, timeout)
        except Failure as failure:
            if failure.error.kind == "deadline" and not cut_by_deadline:
                raise Failure("provider", failure.error.message) from None
            raise

    def _api_once(
        self,
        channel: Channel,
        request: ApiRequest,
        route: None,
        timeout: float,
        *,
        cut_by_deadline: bool,
    ) -> dict[str, Any]:
        """One call of an api: tool, built from the project's stored spec (api_call.py) and
        sent only to a host on its egress allowlist; no redirect is followed (its status is
        the answer). Never retried: a tool's errors go back to the model (spec 3.3)."""
        call = build_call(channel.api_specs, request)
        _allowed_url(channel, call.url, f"api:{request.api}.{request.tool} ({call.url})")
        withheld = provider_secret_names() | {r.key_secret for r in channel.routes if r.key_secret}
        headers = {
            **fill_secrets(call.headers, f"api:{request.api}", channel.secrets, withheld),
            **call.argument_headers,
        }
        try:
            with guarded_client(timeout=timeout) as client:
                with client.stream(
                    call.method, call.url, params=call.query, headers=headers, json=call.body
                ) as response:
                    data = bytearray()  # linear however the server chunks it
                    for chunk in response.iter_bytes():
                        data += chunk
                        if len(data) > MAX_PAGE_BYTES:
                            break
                    kind = response.headers.get("content-type", "")
                    status = response.status_code
        except httpx.TimeoutException:
            if cut_by_deadline:
                raise Failure(
                    "deadline", f"the gate's deadline came before {call.url} answered"
                ) from None
            raise Failure("provider", f"{call.url} did not answer in time") from None
        except RefusedAddress as exc:
            raise Failure("no_route", f"api:{request.api}.{request.tool}: {exc}") from None
        except httpx.HTTPError as exc:
            detail = first_line(str(exc)) or "no answer"
            raise Failure("provider", f"{call.url} could not be reached: {detail}") from None
        except (UnicodeError, ValueError) as exc:
            # httpx refuses to build it: a header argument that is not ASCII, say.
            raise Failure(
                "bad_request", f"api:{request.api}.{request.tool}: {first_line(str(exc))}"
            ) from None
        text = bytes(data[:MAX_PAGE_BYTES]).decode("utf-8", errors="replace")
        body: Any = text[:MAX_API_BODY_CHARS]
        if "json" in kind and len(text) <= MAX_API_BODY_CHARS:
            try:
                body = json.loads(text)
            except (ValueError, RecursionError):
                pass  # not JSON after all, or nested too deep to parse: its text
        return {"status": status, "body": body}

    @staticmethod
    def _api_answered(
        response: dict[str, Any], key: str, attempts: int, started: float
    ) -> tuple[Reply, int, int, float]:
        reply = ApiReply(
            status=response["status"],
            body=response["body"],
            latency_ms=_ms_since(started),
            request_hash=key,
            attempts=attempts,
        )
        return reply, 0, 0, 0.0

    @staticmethod
    def _mcp_answered(
        response: dict[str, Any], key: str, attempts: int, started: float
    ) -> tuple[Reply, int, int, float]:
        reply = McpReply(
            tools=response.get("tools"),
            result=response.get("result"),
            latency_ms=_ms_since(started),
            request_hash=key,
            attempts=attempts,
        )
        return reply, 0, 0, 0.0

    @staticmethod
    def _fetched(
        response: dict[str, Any], key: str, attempts: int, started: float
    ) -> tuple[Reply, int, int, float]:
        reply = FetchReply(
            url=response["url"],
            status=response["status"],
            text=page_text(response["body"].decode("utf-8", errors="replace")),
            redirect_url=response["redirect_url"],
            latency_ms=_ms_since(started),
            request_hash=key,
            attempts=attempts,
        )
        return reply, 0, 0, 0.0

    def _completion(
        self, response: Any, key: str, attempts: int, started: float
    ) -> tuple[Reply, int, int, float]:
        answer = litellm_reply(response)
        usage = answer.get("usage", {})
        tokens_in, tokens_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        cost = self._cost(response)
        reply = CompletionReply(
            content=answer["content"],
            tool_calls=answer.get("tool_calls", []),
            usage={"prompt_tokens": tokens_in, "completion_tokens": tokens_out},
            cost_usd=cost,
            latency_ms=_ms_since(started),
            request_hash=key,
            attempts=attempts,
        )
        return reply, tokens_in, tokens_out, cost

    @staticmethod
    def _moderation(
        response: Any, key: str, attempts: int, started: float
    ) -> tuple[Reply, int, int, float]:
        """A moderation counts as a call, with no tokens and no cost (OpenAI's is free)."""
        try:
            verdict = litellm_moderation(response)
        except ValueError as exc:
            raise Failure("provider", str(exc)) from None
        reply = ModerationReply(
            **verdict,
            latency_ms=_ms_since(started),
            request_hash=key,
            attempts=attempts,
        )
        return reply, 0, 0, 0.0

    def provider_of(self, model: str) -> str | None:
        """LiteLLM's provider of a model name (``gpt-4o`` → ``openai``); None: none known.
        The worker checks a gate's live models with it before any case runs (keys.unrouted)."""
        return self._provider_of(model)

    def _provider_of(self, model: str) -> str | None:
        litellm = self._litellm  # outside the try: an import that fails is not "no provider"
        try:
            return str(litellm.get_llm_provider(model)[1])
        except Exception:
            return None  # LiteLLM knows no provider for this name

    def _forward(
        self,
        channel: Channel,
        request: Request,
        try_once: Callable[[float, bool], Any],
    ) -> tuple[Any, int]:
        """The provider's response and the tries it took; at most ``request.attempts``
        tries, each within the gate's deadline, waiting as the provider asks between them."""
        attempt = 0
        while True:
            attempt += 1
            left = channel.deadline - time.monotonic()
            if left <= 0:
                raise Failure(
                    "deadline",
                    f"the gate's deadline came before {_what(request)} answered "
                    f"({attempt - 1} tries made)",
                )
            timeout = min(request.timeout_s, left)
            try:
                cut = timeout < request.timeout_s
                return try_once(timeout, cut), attempt
            except Failure as failure:
                failure.attempts = attempt
                raise
            except _Retryable as failed:
                if attempt >= request.attempts:
                    failed.failure.attempts = attempt
                    raise failed.failure from None
                wait = failed.retry_after_s
                if wait is None:
                    wait = min(MAX_BACKOFF_S, self.retry_backoff_s * 2 ** (attempt - 1))
                left = channel.deadline - time.monotonic()
                if wait >= left:
                    late = Failure(
                        "deadline",
                        f"{failed.failure.error.message}; the next try would start in "
                        f"{wait:g} s, after the gate's deadline in {max(0.0, left):.1f} s",
                    )
                    late.attempts = attempt
                    raise late from None
                if channel.wait(wait):
                    over = Failure("refused", "the channel's case is over")
                    over.attempts = attempt
                    raise over from None

    def _try(
        self,
        channel: Channel,
        request: CompletionRequest,
        route: Route,
        timeout: float,
        *,
        cut_by_deadline: bool,
    ) -> Any:
        """One try at the provider. A failure worth another try is ``_Retryable``."""
        litellm = self._litellm
        extra: dict[str, Any] = {}
        if route.api_base:
            extra["api_base"] = route.api_base
        if route.api_version:
            extra["api_version"] = route.api_version
        model = route.model
        if route.api == "chat":
            # A route is an OpenAI-compatible endpoint, and many serve chat completions only
            # (a company's LiteLLM proxy, vLLM): LiteLLM would send some model names, or tools
            # with a reasoning effort, to {api_base}/responses instead. The flag is LiteLLM's
            # own (private) switch for that, pinned with its version and held to it by
            # tests/unit/test_gateway_providers.py.
            extra["_skip_responses_api_bridge"] = True
        elif route.api == "responses":
            # LiteLLM's explicit prefix for its Responses API.
            model = "openai/responses/" + model.removeprefix("openai/")
        provider = self._provider_of(route.model)
        # Every provider's request goes through a client whose transport checks each
        # request's address and refuses a redirect (transport.py): the OpenAI SDK's for the
        # providers LiteLLM calls through it, LiteLLM's own HTTP handler for the rest.
        client, http = self._client_for(provider, route, timeout)
        with observing() as exchange:
            try:
                return litellm.completion(
                    model=model,
                    messages=request.messages,
                    tools=request.tools or None,
                    temperature=request.temperature,
                    timeout=timeout,
                    api_key=route.api_key,
                    # The gateway owns retries: neither LiteLLM nor the OpenAI client may add
                    # any.
                    num_retries=0,
                    max_retries=0,
                    **litellm_options(request.options),
                    # Reasoning options apply "where the model allows it" (SDK): LiteLLM drops
                    # the ones it knows a model refuses instead of failing the call.
                    **({"drop_params": True} if request.options else {}),
                    # The agent's output_schema; LiteLLM maps it for each provider.
                    **litellm_response_format(
                        litellm, route.model, request.tools, request.response_format
                    ),
                    client=client,
                    **extra,
                )
            except Exception as exc:
                raise self._failure(
                    channel, request, route, exc, exchange, cut_by_deadline=cut_by_deadline
                ) from None
            finally:
                http.close()

    def _client_for(self, provider: str | None, route: Route, timeout: float) -> tuple[Any, Any]:
        """The client LiteLLM is handed for one try, and the httpx client to close after it."""
        http = model_client(timeout)
        if provider in OPENAI_SDK_PROVIDERS:
            return self._openai_client(route, timeout, http), http
        if provider in AZURE_SDK_PROVIDERS:
            azure = self._openai.AzureOpenAI(
                api_key=route.api_key,
                azure_endpoint=route.api_base,
                api_version=route.api_version,
                timeout=timeout,
                max_retries=0,
                http_client=http,
            )
            return azure, http
        from litellm.llms.custom_httpx.http_handler import HTTPHandler

        return HTTPHandler(timeout=timeout, client=http), http

    def _openai_client(self, route: Route, timeout: float, http: Any) -> Any:
        """An OpenAI client for one try: its endpoint named (never the worker's environment's),
        its timeout, no retries of its own, and ``http`` (a transport.model_client)."""
        return self._openai.OpenAI(
            api_key=route.api_key,
            base_url=route.api_base or OPENAI_BASE,
            timeout=timeout,
            max_retries=0,
            http_client=http,
        )

    def _moderation_route(self, channel: Channel, request: ModerationRequest) -> Route:
        """A moderation goes to OpenAI's moderation API or an OpenAI-compatible project route,
        with that provider's key: a key of another provider is never sent to either."""
        model = request.model if "/" in request.model else f"openai/{request.model}"
        route = self._route(channel, request, model)
        if self._provider_of(route.model) not in OPENAI_SDK_PROVIDERS:
            raise Failure(
                "no_route",
                f"moderation model {request.model}: the gateway runs moderations on OpenAI's "
                "moderation API (an openai/ model, with OPENAI_API_KEY) or on a project "
                "route's OpenAI-compatible endpoint only",
            )
        return route

    def _moderate_once(
        self,
        channel: Channel,
        request: ModerationRequest,
        route: Route,
        timeout: float,
        *,
        cut_by_deadline: bool,
    ) -> Any:
        bare = route.model.split("/", 1)[1] if "/" in route.model else route.model
        # LiteLLM's moderation() builds its OpenAI client without the timeout and with the
        # SDK's own retries, and without an api_base falls back to the process environment:
        # the gateway hands it a client that has none of that.
        http = model_client(timeout)
        client = self._openai_client(route, timeout, http)
        with observing() as exchange:
            try:
                return self._litellm.moderation(
                    input=request.input, model=bare, api_key=route.api_key, client=client
                )
            except Exception as exc:
                raise self._failure(
                    channel, request, route, exc, exchange, cut_by_deadline=cut_by_deadline
                ) from None
            finally:
                http.close()

    def _failure(
        self,
        channel: Channel,
        request: CompletionRequest | ModerationRequest,
        route: Route,
        exc: Exception,
        exchange: Exchange,
        *,
        cut_by_deadline: bool,
    ) -> Exception:
        """A provider's exception as the Failure it ends in, or _Retryable when another try
        may help. Its message is the readable reason (``_reason``), never the library's."""
        # LiteLLM's exceptions for completions, the OpenAI SDK's for moderations.
        litellm, openai = self._litellm, self._openai
        who = _provider_name(route, self._provider_of(route.model))
        refused = _wrapped(exc, RefusedAddress)
        if refused is not None:  # a hop to metadata, a redirect: no other try gets past it
            return Failure("no_route", self._redacted(channel, request, f"{who}: {refused}"))
        timed_out = isinstance(exc, litellm.Timeout | openai.APITimeoutError)
        if timed_out and cut_by_deadline:
            return Failure(
                "deadline", f"the gate's deadline came before model {request.model} answered"
            )
        message = self._reason(channel, request, who, exc, exchange, timed_out=timed_out)
        if timed_out:
            return _Retryable(Failure("provider", message), None)
        status = getattr(exc, "status_code", None)
        if exchange.status is not None:
            status = exchange.status
        # What the provider answered, if it did, for the runner to tell the agent's failures
        # from the provider's (runtime_errors.ModelCallError.outside_the_agent): once a
        # request was sent, only the status that came back (a hang-up is LiteLLM's made-up
        # 500); before, the library's own (a 400 for an option the model does not take).
        answered = exchange.status if exchange.url else status
        if not isinstance(answered, int) or isinstance(answered, bool):
            answered = None
        if isinstance(exc, litellm.RateLimitError | openai.RateLimitError):
            limited = Failure("rate_limited", message, provider_status=answered or 429)
            return _Retryable(limited, _retry_after(exc))
        failure = Failure("provider", message, provider_status=answered)
        if isinstance(exc, litellm.APIConnectionError | openai.APIConnectionError) or (
            isinstance(status, int) and status >= 500
        ):
            return _Retryable(failure, _retry_after(exc))
        return failure

    def _reason(
        self,
        channel: Channel,
        request: CompletionRequest | ModerationRequest,
        who: str,
        exc: BaseException,
        exchange: Exchange,
        *,
        timed_out: bool,
    ) -> str:
        """What went wrong at the provider, for a person: who (the provider, or the project's
        route), the path called, the HTTP status and the first characters of its answer; or
        why no answer came. No library's class name, traceback or file path: the exception's
        own text is used only when nothing was sent, and then only its first line."""
        where = f"{exchange.method} {exchange.path}" if exchange.url else ""
        if timed_out:
            text = f"{who} did not answer {where or 'the call'} within {request.timeout_s:g} s"
        elif exchange.status is not None:
            excerpt = " ".join(exchange.body.decode("utf-8", errors="replace").split())
            text = f"{who} answered HTTP {exchange.status} to {where}"
            if 200 <= exchange.status < 300:
                text += ", not in the shape of its API"
            text += f": {excerpt[:BODY_EXCERPT_BYTES]}" if excerpt else " with an empty body"
        elif exchange.url:
            cause = _wrapped(exc, httpx.TransportError)
            detail = first_line(str(cause)) if cause is not None else ""
            text = f"{who} could not be reached at {where}: {detail or 'the connection failed'}"
        else:
            text = f"{who}: {_plain(str(exc)) or 'the call failed before anything was sent'}"
        return self._redacted(channel, request, text)

    @staticmethod
    def _redacted(
        channel: Channel, request: CompletionRequest | ModerationRequest, text: str
    ) -> str:
        """``text`` with no secret value of the project in it: redacted as everything stored
        for a case is (one matcher, the longest value first, so a value that contains another
        is never left half in place). A moderation says so: the runner's prefix names only
        the model."""
        if isinstance(request, ModerationRequest):
            text = f"moderation: {text}"
        return Redactor(channel.secrets).text(text)[:MAX_MESSAGE_CHARS]

    def _cost(self, response: Any) -> float:
        """The call's price from LiteLLM's cost map; 0 for a model the map does not know."""
        try:
            return float(self._litellm.completion_cost(completion_response=response) or 0.0)
        except Exception:
            return 0.0


# OpenAI's endpoint, named: the client would otherwise read OPENAI_BASE_URL from the worker's
# environment, which is no project's.
OPENAI_BASE = "https://api.openai.com/v1"
# LiteLLM's providers it calls through the OpenAI SDK (a client of that SDK is what it takes),
# and through the SDK's Azure client; every other provider takes LiteLLM's HTTP handler.
OPENAI_SDK_PROVIDERS = frozenset({"openai", "text-completion-openai", "custom_openai"})
AZURE_SDK_PROVIDERS = frozenset({"azure", "azure_text"})


def _provider_name(route: Route, provider: str | None) -> str:
    """Who answered, for a reason: the project's route, or the provider."""
    if route.api is not None:  # only a project route has an API of its own
        return f"the project's {route.via}"
    return provider or route.model.partition("/")[0]


def _plain(text: str) -> str:
    """A library's message without its class-name prefixes (``litellm.BadRequestError: ``,
    ``OpenAIException - ``) or traceback: plain string steps, linear in its length."""
    line = first_line(text)
    for _ in range(8):
        for separator in (": ", " - "):
            head, found, rest = line.partition(separator)
            if found and _class_name(head):
                line = rest.strip()
                break
        else:
            break
    return line


def _class_name(word: str) -> bool:
    """``word`` is a (dotted) exception class name such as ``litellm.NotFoundError``."""
    name = word.strip().rpartition(".")[2]
    return (
        bool(name)
        and name.endswith(("Error", "Exception"))
        and name.replace("_", "a").isalnum()
        and all(part.replace("_", "a").isalnum() for part in word.strip().split("."))
    )


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)

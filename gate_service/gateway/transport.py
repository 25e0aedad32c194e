"""The gateway's HTTP clients, which refuse every request (each redirect hop included) to an
address a project may not point the worker at (endpoints.refused_address: link-local,
cloud metadata), checked as the request is sent.

A project chooses its endpoints (model routes, ``*_API_BASE`` secrets, its egress allowlist),
so an endpoint may answer with a redirect to cloud metadata, or to any other host the worker
reaches; the check at the call's start sees only the first host. Pages and MCP sessions
follow redirects themselves, each hop checked again. A model endpoint's redirect is never
followed, whatever the provider: ``ModelTransport`` turns it into an error naming its target
before any client library (LiteLLM's HTTP handler, the OpenAI SDK) can follow it, and
``install_litellm_guard`` makes every HTTP client LiteLLM builds for itself use it too.

``ModelTransport`` also keeps what the provider answered to the call in flight on this thread
(``observing``): the URL, the status and the body's first bytes, which make a provider's
failure a readable reason instead of a client library's exception.
"""

from __future__ import annotations

import functools
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from ..endpoints import refused_address

# How much of a provider's answer is kept for a failure's reason.
BODY_EXCERPT_BYTES = 300


class RefusedAddress(httpx.ConnectError):
    """A request to an address the gateway does not call: a connection error to the client
    (no retry can reach it either)."""


class RefusedRedirect(RefusedAddress):
    """A model endpoint answered a redirect: the gateway follows none (its target is never
    asked), and no other try can get past it."""


def foreign_host(request: httpx.Request) -> str | None:
    """Why ``request`` may not go: its Host header is not its URL's own (the one httpx
    writes), whatever set it. The allowlist and the address checks judge the URL's host, so
    a request whose Host names another (an internal admin site behind a shared proxy) is
    refused here as well as where its headers are filled (endpoints.REFUSED_HEADERS)."""
    hosts = request.headers.get_list("host")
    own = request.url.netloc.decode("ascii", "replace")
    if [h.lower() for h in hosts] != [own.lower()]:
        return f"its Host header is not its URL's ({own}): the gateway does not send it"
    return None


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """The TLS context of every client here, made once (httpx's default: certifi's roots, or
    SSL_CERT_FILE / SSL_CERT_DIR). Loading the roots is about 50 ms of CPU, and each model
    call's try builds a client of its own, so a context per client was most of what a call
    cost the worker; an SSLContext is safe to share between threads."""
    return httpx.create_ssl_context()


class GuardedTransport(httpx.HTTPTransport):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("verify", shared_tls_context())
        super().__init__(**kwargs)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        problem = refused_address(str(request.url)) or foreign_host(request)
        if problem is not None:
            raise RefusedAddress(problem, request=request)
        return super().handle_request(request)


def guarded_client(**kwargs: Any) -> httpx.Client:
    """An httpx client whose every request goes through GuardedTransport, following no
    redirect by itself."""
    return httpx.Client(transport=GuardedTransport(), follow_redirects=False, **kwargs)


@dataclass(slots=True)
class Exchange:
    """What the provider answered to the last request of one model call (``observing``)."""

    method: str = ""
    url: str = ""
    status: int | None = None
    body: bytes = b""

    @property
    def path(self) -> str:
        """The URL's path, without its query (Azure's api-version, a key in a query)."""
        return httpx.URL(self.url).path if self.url else ""


_observed = threading.local()


@contextmanager
def observing() -> Iterator[Exchange]:
    """The exchange of the model call made on this thread inside the block. Calls are
    forwarded synchronously on the channel's thread, so a thread-local sees exactly its own
    call, through whichever client LiteLLM picked."""
    exchange = Exchange()
    previous = getattr(_observed, "exchange", None)
    _observed.exchange = exchange
    try:
        yield exchange
    finally:
        _observed.exchange = previous


class _Peek(httpx.SyncByteStream):
    """A response body passed on unchanged, its first bytes copied into the exchange."""

    def __init__(self, inner: httpx.SyncByteStream, exchange: Exchange) -> None:
        self._inner = inner
        self._exchange = exchange

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            room = BODY_EXCERPT_BYTES - len(self._exchange.body)
            if room > 0:
                self._exchange.body += chunk[:room]
            yield chunk

    def close(self) -> None:
        self._inner.close()


class ModelTransport(GuardedTransport):
    """GuardedTransport for model calls: a redirect is an error naming its target, and the
    answer is observed for the failure's reason."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        exchange: Exchange | None = getattr(_observed, "exchange", None)
        if exchange is not None:
            exchange.method, exchange.url = request.method, str(request.url)
            exchange.status, exchange.body = None, b""
        response = super().handle_request(request)
        if response.has_redirect_location:
            target = response.headers.get("location", "")
            response.close()
            raise RefusedRedirect(
                f"the endpoint answered HTTP {response.status_code}, a redirect to "
                f"{target[:200]}: the gateway follows no redirect of a model endpoint",
                request=request,
            )
        if exchange is not None:
            exchange.status = response.status_code
            stream = response.stream
            if isinstance(stream, httpx.SyncByteStream):
                response.stream = _Peek(stream, exchange)
        return response


def model_client(timeout: float | httpx.Timeout | None = None) -> httpx.Client:
    """An httpx client for model calls: ModelTransport, no redirect followed."""
    return httpx.Client(
        transport=ModelTransport(), follow_redirects=False, timeout=timeout or 600.0
    )


def install_litellm_guard(litellm: Any) -> None:
    """Every HTTP client LiteLLM builds for itself from now on is a ``model_client``, and the
    one it built at import is replaced: some providers' paths (Cohere's, for one) take no
    client from the caller, so the per-call client cannot be the only guard. Idempotent."""
    from litellm.llms.custom_httpx.http_handler import HTTPHandler

    def create_client(self: Any) -> httpx.Client:
        return model_client(self.timeout)

    HTTPHandler.create_client = create_client  # type: ignore[method-assign]
    # The OpenAI SDK clients LiteLLM makes without one from the caller use this session.
    litellm.client_session = model_client()
    existing = litellm.__dict__.get("module_level_client")
    if isinstance(existing, HTTPHandler):
        existing.client = model_client(existing.timeout)

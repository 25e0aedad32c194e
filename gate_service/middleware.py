"""HTTP middleware: a request id on every answer, the trusted-host check, and opt-in CORS."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware

from .config import Settings
from .errors import REQUEST_ID_HEADER, REQUEST_ID_SCOPE_KEY, error_body, new_request_id

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_ADMITTED = "gate.host_admitted"
CORS_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
CORS_HEADERS = ("Authorization", "Content-Type", "Idempotency-Key", "If-None-Match")
CORS_EXPOSED = ("Location", "ETag", "Retry-After", REQUEST_ID_HEADER)


def comma_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class RequestId:
    """Give each request an id (in the scope, for the error handlers) and answer it as a header.

    Always made here, never taken from the client: it names a line in this service's log.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope[REQUEST_ID_SCOPE_KEY] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                headers.append((REQUEST_ID_HEADER.lower().encode(), request_id.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_id)


def host_patterns(hosts: list[str]) -> list[str]:
    """Starlette compares the Host header's host, which keeps an IPv6 literal's brackets."""
    patterns = []
    for host in hosts:
        patterns.append(host)
        if ":" in host and not host.startswith("["):
            patterns.append(f"[{host}]")
    return patterns


class TrustedHosts:
    """Starlette's TrustedHostMiddleware, answering a bad Host in the one error shape.

    A request whose Host is not on the list never reaches a route: that stops DNS rebinding,
    where a page in a browser reaches a service on localhost under the page's own host name.
    """

    def __init__(self, app: ASGIApp, hosts: list[str]) -> None:
        self.app = app
        self.hosts = hosts
        self.check = TrustedHostMiddleware(
            self._admit, allowed_hosts=host_patterns(hosts), www_redirect=False
        )

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[_ADMITTED] = True
        await self.app(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_if_admitted(message: Message) -> None:
            if scope.get(_ADMITTED):
                await send(message)

        await self.check(scope, receive, send_if_admitted)
        if scope.get(_ADMITTED):
            return
        host = Headers(scope=scope).get("host", "")
        shown = repr(host[:100]) if host else "(none)"
        response = JSONResponse(
            error_body(
                "BadRequest",
                f"the Host header {shown} is not one this service answers to; the operator "
                "lists the names it may be reached by in GATE_TRUSTED_HOSTS",
            ),
            status_code=400,
        )
        await response(scope, receive, send)


def install_middleware(app: FastAPI, settings: Settings) -> None:
    """Call after every other add_middleware: the last added runs first.

    Order of a request: request id → trusted host → CORS (only if configured) → the rest.
    """
    origins = comma_list(settings.cors_origins)
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_credentials=False,
            allow_methods=list(CORS_METHODS),
            allow_headers=list(CORS_HEADERS),
            expose_headers=list(CORS_EXPOSED),
        )
    hosts = comma_list(settings.trusted_hosts)
    if not hosts:
        raise ValueError("GATE_TRUSTED_HOSTS is empty: list the host names, or '*' for any")
    for host in hosts:
        if "*" in host[1:] or (host.startswith("*") and host != "*" and not host.startswith("*.")):
            raise ValueError(f"GATE_TRUSTED_HOSTS: {host!r} must be a name, '*.domain' or '*'")
    app.add_middleware(TrustedHosts, hosts=hosts)
    app.add_middleware(RequestId)

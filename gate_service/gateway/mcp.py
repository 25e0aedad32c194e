"""MCP servers on a case's behalf (spec 3.3: remote Streamable HTTP, tools only): the
gateway lists a server's tools or calls one with the ``mcp`` SDK's client, so a case that
has no network still reaches its agent's MCP servers, and only those on the project's
egress allowlist.

One MCP session a request: ``initialize``, then ``tools/list`` (every page) or one
``tools/call``, then the session is closed. A server that keeps state between calls of one
session does not see them as one session (decided: a gate's call is independent and
replayable on its own).

Headers are the agent's as written. ``${VAR}`` is filled from the project's secrets, except
the provider and route keys the gateway keeps for model calls, and ``${context.path}`` from
what the runner resolved from the run's context; in one pass, so a value put in by either is
never expanded again (a context value ``${OPENAI_API_KEY}`` stays that text). A header no
tenant may set (``Host``, hop-by-hop, another authority: endpoints.REFUSED_HEADERS) fails the
request naming it, and nothing is sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from typing import Any

import anyio
import httpx

from gate_runner.gateway_wire import McpRequest

from ..endpoints import header_name_problem, header_value_problem, refused_address, shown
from .failure import Failure, first_line
from .transport import RefusedAddress, foreign_host, shared_tls_context

# A server offers at most this many tools, over at most this many pages of tools/list.
MAX_TOOLS = 500
MAX_PAGES = 20
# The JSON of one tool result the case receives: beyond it the call is an error.
MAX_RESULT_CHARS = 1_000_000
# What one MCP session may read from its server in all, before anything is parsed: the SDK
# reads a reply whole, so this is what bounds the worker's memory.
MAX_SESSION_BYTES = 8 * 1024 * 1024


class TooMuch(Exception):
    """A server sent more than its session may read."""


class _Counted(httpx.AsyncByteStream):
    def __init__(self, inner: Any, transport: GuardedAsyncTransport) -> None:
        self._inner = inner
        self._transport = transport  # whose count every response of one session shares

    async def __aiter__(self) -> Any:
        async for chunk in self._inner:
            self._transport.left -= len(chunk)
            if self._transport.left < 0:
                # The SDK logs an error in reading a reply and waits on: end the session.
                self._transport.overflowed()
                raise TooMuch(f"it sent over {MAX_SESSION_BYTES} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class GuardedAsyncTransport(httpx.AsyncHTTPTransport):
    """transport.GuardedTransport for the mcp SDK's async client: every request (each
    redirect the SDK follows within the server's origin included) is refused at a link-local
    or cloud-metadata address, and every response counts against the session's bytes."""

    def __init__(self, overflowed: Callable[[], None] = lambda: None, **kwargs: Any) -> None:
        kwargs.setdefault("verify", shared_tls_context())  # made once: see there
        super().__init__(**kwargs)
        self.left = MAX_SESSION_BYTES
        self.overflowed = overflowed

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        problem = refused_address(str(request.url)) or foreign_host(request)
        if problem is not None:
            raise RefusedAddress(problem, request=request)
        response = await super().handle_async_request(request)
        response.stream = _Counted(response.stream, self)
        return response


def fill_secrets(
    headers: Mapping[str, str],
    who: str,
    secrets: Mapping[str, str],
    withheld: Collection[str],
    context_values: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``headers`` with every placeholder filled in one pass: ``${context.path}`` from
    ``context_values``, ``${NAME}`` from ``secrets`` (never one of ``withheld``, the keys
    the gateway keeps for model calls); ``Failure("no_route")`` naming the first one that
    cannot be. ``who`` names the caller in the message.

    A header no tenant may set (``Host``, hop-by-hop and framing headers, ones naming
    another client or host: endpoints.REFUSED_HEADERS), a name that is no token, or a value
    that holds a line break or another control character once filled, is
    ``Failure("bad_request")`` naming the header, before anything is sent."""
    values = context_values or {}
    filled = {}
    for name, template in headers.items():
        refused = header_name_problem(name)
        if refused is not None:
            raise Failure("bad_request", f"{who}: header {shown(name)} is refused: {refused}")

        def value(ref: str, header: str = name) -> str:
            if ref.startswith("context."):
                if ref not in values:
                    raise Failure(
                        "no_route",
                        f"{who}: header {header} uses ${{{ref}}}, which the run did not resolve",
                    )
                return values[ref]
            if ref in withheld:
                raise Failure(
                    "no_route",
                    f"{who}: header {header} uses ${{{ref}}}, a model provider's key, which "
                    "the gateway uses for model calls only",
                )
            if ref not in secrets:
                raise Failure(
                    "no_route",
                    f"{who}: header {header} uses ${{{ref}}}, which is not one of the "
                    "project's secrets (gate admin secrets-set)",
                )
            return secrets[ref]

        filled[name] = _fill(template, value)
        wrong = header_value_problem(filled[name])
        if wrong is not None:
            # Never the value: it may hold a secret.
            raise Failure("bad_request", f"{who}: the value of header {name} {wrong}")
    return filled


def _fill(template: str, value: Callable[[str], str]) -> str:
    r"""``template`` with each ``${REF}`` replaced by ``value(REF)``, left to right, in one
    pass (what is put in is never read again): what the pattern ``\$\{([^}]*)\}`` replaced,
    without its quadratic rescan of a ``${`` that no ``}`` closes (``"${" * N``)."""
    out = []
    at = 0
    while True:
        start = template.find("${", at)
        if start < 0:
            break
        end = template.find("}", start + 2)
        if end < 0:
            break  # no "}" after it: no later "${" is closed either
        out.append(template[at:start])
        out.append(value(template[start + 2 : end]))
        at = end + 1
    out.append(template[at:])
    return "".join(out)


def fill_headers(
    request: McpRequest, secrets: Mapping[str, str], withheld: Collection[str]
) -> dict[str, str]:
    """An MCP request's headers, filled (fill_secrets)."""
    return fill_secrets(
        request.headers, f"MCP server {request.server}", secrets, withheld, request.context_values
    )


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside the task groups' exception groups the SDK raises."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def mcp_once(request: McpRequest, headers: dict[str, str], timeout: float) -> dict[str, Any]:
    """One MCP session for ``request``: ``{"tools": [...]}`` or ``{"result": {...}}``.

    Runs its own event loop on the calling thread (the channel serves each request on a
    thread of its own). Raises ``Failure``: ``no_route`` for a refused address, ``provider``
    for a server that cannot be reached or answers an error, ``deadline`` past ``timeout``.
    """
    what = f"MCP server {request.server} ({request.url})"
    try:
        return anyio.run(_session, request, headers, timeout)
    except BaseException as exc:  # exception groups: the SDK runs its transport in tasks
        leaf = _leaf(exc)
        if isinstance(leaf, Failure):
            raise leaf from None
        if isinstance(leaf, RefusedAddress):
            raise Failure("no_route", f"{what}: {leaf}") from None
        if isinstance(leaf, TooMuch):
            raise Failure("provider", f"{what}: {leaf}") from None
        if isinstance(leaf, TimeoutError):
            raise Failure("deadline", f"{what} did not answer within {timeout:.0f} s") from None
        if isinstance(leaf, KeyboardInterrupt | SystemExit):
            raise
        # Its first line only, and no class name: the reason is stored and shown to people.
        detail = first_line(str(leaf), limit=2000) or "the session failed"
        raise Failure("provider", f"{what}: {detail}"[:2000]) from None


async def _session(request: McpRequest, headers: dict[str, str], timeout: float) -> dict[str, Any]:
    # Imported here: the mcp SDK is the gateway's alone, and only cases with MCP servers
    # pay for its import.
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    with anyio.fail_after(timeout), anyio.CancelScope() as session_scope:
        transport = GuardedAsyncTransport(overflowed=session_scope.cancel)
        async with (
            httpx.AsyncClient(
                transport=transport,
                headers=headers,
                timeout=httpx.Timeout(timeout),
                follow_redirects=False,
            ) as client,
            streamable_http_client(request.url, http_client=client) as (read, write, _),
            ClientSession(read, write, read_timeout_seconds=timedelta(seconds=timeout)) as session,
        ):
            await session.initialize()
            if request.op == "list":
                return {"tools": await _tools(session, request)}
            result = await session.call_tool(request.tool, request.arguments)
            parts = [part.model_dump(mode="json", exclude_none=True) for part in result.content]
            answer = {"is_error": bool(result.isError), "parts": parts}
            if len(json.dumps(answer)) > MAX_RESULT_CHARS:
                answer = {
                    "is_error": True,
                    "parts": [
                        {
                            "type": "text",
                            "text": f"the result of {request.tool} is over "
                            f"{MAX_RESULT_CHARS} characters; the gate does not pass it on",
                        }
                    ],
                }
            return {"result": answer}
    # Only a cancelled session gets here: its server sent more than it may read.
    raise TooMuch(f"it sent over {MAX_SESSION_BYTES} bytes")


async def _tools(session: Any, request: McpRequest) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    cursor = None
    for _ in range(MAX_PAGES):
        page = await session.list_tools(cursor)
        for tool in page.tools:
            tools.append(
                {
                    "name": tool.name,
                    "description": tool.description or "",
                    "input_schema": dict(tool.inputSchema or {"type": "object"}),
                }
            )
        cursor = page.nextCursor
        if len(tools) > MAX_TOOLS or (cursor and len(tools) == MAX_TOOLS):
            raise Failure("provider", f"MCP server {request.server} lists over {MAX_TOOLS} tools")
        if not cursor:
            return tools
    raise Failure(
        "provider", f"MCP server {request.server} lists its tools over more than {MAX_PAGES} pages"
    )

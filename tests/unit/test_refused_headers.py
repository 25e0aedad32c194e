"""Headers no tenant value may set on a request the gateway sends (endpoints.REFUSED_HEADERS):
``Host`` (the request's host is its URL's, the one the allowlist judged), hop-by-hop and
framing headers, and headers that name another client, host, path or method to a proxy.
A name that is no token and a value holding a line break or another control character are
refused too. Refused, never dropped: the agent (a ``bad_request`` naming the header) or the
admin (a 422 when a spec is stored) learns which header and why.

Each is sent through the real gateway (a channel's Unix socket) at a real listener on
127.0.0.1 that records what it receives: a refused header never arrives, nothing does, and
an allowed one arrives with the URL's own Host. Before this, with 127.0.0.1 allowlisted, an
MCP server received ``Host: internal-admin.corp.example`` from the case.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from gate_runner.gateway_wire import API_PATH, FETCH_PATH, MCP_PATH
from gate_service.api_specs import convert
from gate_service.bundles.suites import validate_project
from gate_service.errors import RequestInvalid
from gate_service.gateway.mcp import GuardedAsyncTransport
from gate_service.gateway.transport import RefusedAddress, guarded_client
from tests.fixtures.gateway import Gateways, post
from tests.fixtures.listener import Listener
from tests.fixtures.projects import write

# Each header name the gateway refuses, as a case or an admin might spell it.
REFUSED_NAMES = [
    "Host", "host", "HOST",
    "Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Upgrade",
    "Transfer-Encoding", "Content-Length", "Expect",
    "Proxy-Authorization", "Proxy-Authenticate",
    "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded", "Via",
    "X-Real-IP", "X-Client-IP", "True-Client-IP", "X-Original-URL", "X-Rewrite-URL",
    "X-Original-Host", "X-Host", "X-HTTP-Method-Override",
    ":authority", "X Bad", "X-A\r\nX-Injected", "",
]  # fmt: skip
# Values no header may carry (never quoted back: a value may hold a secret).
REFUSED_VALUES = ["a\r\nX-Injected: 1", "a\nX-Injected: 1", "a\rb", "a\x00b", "a\x01b", "café"]
FOREIGN = "internal-admin.corp.example"


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    try:
        yield server
    finally:
        server.close()


def mcp(channel: Any, url: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    # A short timeout: the listener is no MCP server, and the SDK waits on a reply it cannot
    # parse (logging it) until the session's time is up.
    body = {"server": "orders", "url": url, "op": "list", "headers": headers, "timeout_s": 2}
    return post(channel.folder, body, token=channel.token, path=MCP_PATH)


@pytest.mark.slow
@pytest.mark.parametrize("name", REFUSED_NAMES)
def test_an_mcp_header_no_tenant_may_set_is_refused_and_never_arrives(
    gateways: Gateways, listener: Listener, name: str
) -> None:
    channel = gateways.open({}, egress=["127.0.0.1"])
    status, answer = mcp(channel, f"{listener.url}/mcp", {name: FOREIGN})
    assert (status, answer["error"]["kind"]) == (400, "bad_request"), answer
    assert "is refused" in answer["error"]["message"]
    assert listener.received == []


@pytest.mark.slow
@pytest.mark.parametrize("value", REFUSED_VALUES)
def test_an_mcp_header_value_with_a_line_break_or_control_is_refused(
    gateways: Gateways, listener: Listener, value: str
) -> None:
    # Filled from a secret or written into the agent: either way, checked as filled.
    channel = gateways.open({"TOKEN": value}, egress=["127.0.0.1"])
    for headers in ({"X-Custom": value}, {"Authorization": "Bearer ${TOKEN}"}):
        status, answer = mcp(channel, f"{listener.url}/mcp", headers)
        assert (status, answer["error"]["kind"]) == (400, "bad_request"), answer
        name = next(iter(headers))
        assert f"the value of header {name} holds" in answer["error"]["message"]
        assert value not in answer["error"]["message"]
    assert listener.received == []


@pytest.mark.slow
def test_an_allowed_mcp_header_arrives_with_the_urls_own_host(
    gateways: Gateways, listener: Listener
) -> None:
    channel = gateways.open({"TOKEN": "t-7"}, egress=["127.0.0.1"])
    headers = {"X-Custom": "fine", "Authorization": "Bearer ${TOKEN}"}
    mcp(channel, f"{listener.url}/mcp", headers)  # the listener is no MCP server: it fails
    assert listener.received, "the request never reached the listener"
    first = listener.received[0]
    assert first.named("X-Custom") == ["fine"]
    assert first.named("Authorization") == ["Bearer t-7"]
    assert first.named("Host") == [f"127.0.0.1:{listener.port}"]


def document(listener: Listener) -> dict[str, Any]:
    """An OpenAPI document of one GET with a header parameter X-Trace."""
    return {
        "openapi": "3.0.3",
        "servers": [{"url": listener.url}],
        "paths": {
            "/orders/{id}": {
                "get": {
                    "operationId": "getOrder",
                    "parameters": [
                        {"name": "id", "in": "path"},
                        {"name": "X-Trace", "in": "header"},
                    ],
                }
            }
        },
    }


def spec(listener: Listener, **stored: Any) -> dict[str, Any]:
    """The project's stored specs as the gateway gets them (``stored``: fields replaced, as
    a spec stored before a check was made could hold them)."""
    return {"orders": {**convert(document(listener)).stored(), **stored}}


def api(channel: Any, **arguments: Any) -> tuple[int, dict[str, Any]]:
    body = {"api": "orders", "tool": "order_get", "arguments": {"id": "1", **arguments}}
    return post(channel.folder, body, token=channel.token, path=API_PATH)


@pytest.mark.slow
@pytest.mark.parametrize("name", REFUSED_NAMES)
def test_a_stored_spec_header_no_tenant_may_set_is_refused_when_stored_and_at_a_call(
    gateways: Gateways, listener: Listener, name: str
) -> None:
    with pytest.raises(RequestInvalid) as refused:
        convert(document(listener), headers={name: FOREIGN})
    assert "is refused" in str(refused.value.detail)
    # One stored before headers were checked: refused at the call, nothing sent.
    channel = gateways.open(
        {}, egress=["127.0.0.1"], api_specs=spec(listener, headers={name: FOREIGN})
    )
    status, answer = api(channel)
    assert (status, answer["error"]["kind"]) == (400, "bad_request"), answer
    assert "is refused" in answer["error"]["message"]
    assert listener.received == []


@pytest.mark.parametrize("value", REFUSED_VALUES)
def test_an_api_header_argument_with_a_line_break_or_control_is_refused(
    gateways: Gateways, listener: Listener, value: str
) -> None:
    channel = gateways.open({}, egress=["127.0.0.1"], api_specs=spec(listener))
    status, answer = api(channel, **{"X-Trace": value})
    assert (status, answer["error"]["kind"]) == (400, "bad_request"), answer
    assert "the value of header X-Trace holds" in answer["error"]["message"]
    assert listener.received == []
    # And the same value as a spec's header, when stored.
    with pytest.raises(RequestInvalid) as refused:
        convert(document(listener), headers={"X-Key": value})
    assert "the value of header X-Key holds" in str(refused.value.detail)


@pytest.mark.parametrize("name", ["Host", "X-Forwarded-Host", "Transfer-Encoding"])
def test_a_header_parameter_no_tenant_may_set_is_refused_when_stored_and_at_a_call(
    gateways: Gateways, listener: Listener, name: str
) -> None:
    # The case would choose its value: the spec naming it is refused.
    document = {
        "openapi": "3.0.3",
        "servers": [{"url": listener.url}],
        "paths": {"/o": {"get": {"operationId": "getO", "parameters": [
            {"name": name, "in": "header"}]}}},
    }  # fmt: skip
    with pytest.raises(RequestInvalid) as refused:
        convert(document)
    assert f"the header parameter '{name}' is refused" in str(refused.value.detail)
    # A spec stored before: the call is refused, nothing sent.
    stored = spec(listener)
    tool = stored["orders"]["tools"]["order_get"]
    tool["in"] = {"id": "path", name: "header"}
    channel = gateways.open({}, egress=["127.0.0.1"], api_specs=stored)
    status, answer = api(channel, **{name: FOREIGN})
    assert (status, answer["error"]["kind"]) == (400, "bad_request"), answer
    assert listener.received == []


def test_an_allowed_api_header_arrives_with_the_urls_own_host(
    gateways: Gateways, listener: Listener
) -> None:
    channel = gateways.open({}, egress=["127.0.0.1"], api_specs=spec(listener))
    status, answer = api(channel, **{"X-Trace": "t-1"})
    assert (status, answer.get("status")) == (200, 200), answer
    (received,) = listener.received
    assert received.named("X-Trace") == ["t-1"]
    assert received.named("Host") == [f"127.0.0.1:{listener.port}"]


def test_a_page_request_takes_no_headers_from_the_case(
    gateways: Gateways, listener: Listener
) -> None:
    channel = gateways.open({}, egress=["127.0.0.1"])
    body = {"url": f"{listener.url}/page", "headers": {"Host": FOREIGN}}
    status, answer = post(channel.folder, body, token=channel.token, path=FETCH_PATH)
    assert (status, answer["error"]["kind"]) == (400, "bad_request"), answer
    assert "unknown field(s) in the request: headers" in answer["error"]["message"]
    assert listener.received == []


def test_the_guarded_transports_send_no_host_but_the_urls(listener: Listener) -> None:
    """The last check, whatever set the header: each guarded client refuses a request whose
    Host is not its URL's, before connecting."""
    with guarded_client(timeout=5) as client:
        with pytest.raises(RefusedAddress, match="its Host header is not its URL's"):
            client.get(listener.url, headers={"Host": FOREIGN})
        assert client.get(listener.url, headers={"Host": f"127.0.0.1:{listener.port}"})

    async def through_the_mcp_transport() -> None:
        async with httpx.AsyncClient(transport=GuardedAsyncTransport()) as client:
            with pytest.raises(RefusedAddress, match="its Host header is not its URL's"):
                await client.get(listener.url, headers={"Host": FOREIGN})

    anyio.run(through_the_mcp_transport)
    assert len(listener.received) == 1  # the one with the URL's own Host


def test_a_bundles_mcp_server_with_a_refused_url_or_header_fails_validation(
    tmp_path: Path,
) -> None:
    root = write(
        tmp_path / "p",
        {
            "agents/desk.yaml": """
                version: "1.0"
                name: desk
                description: Uses two MCP servers.
                model: openai/gpt-4o
                system_prompt: Help.
                mcp_servers:
                  - name: metadata
                    url: http://0xa9fea9fe/latest
                  - name: orders
                    url: http://127.0.0.1:9/mcp
                    headers:
                      Host: internal-admin.corp.example
                      X-User-Id: u-1
            """,
            "tests/desk.yaml": """
                tests:
                  - name: answers
                    payload: hi
            """,
        },
    )
    messages = [p["message"] for p in validate_project(root).problems]
    assert any("mcp_servers.metadata: url: " in m and "169.254.169.254" in m for m in messages), (
        messages
    )
    assert any("mcp_servers.orders: header 'Host' is refused" in m for m in messages), messages
    assert not any("X-User-Id" in m for m in messages), messages


def test_every_guarded_client_shares_one_tls_context() -> None:
    """Loading the CA roots is about 50 ms of CPU and each model call's try builds a client:
    made per client, it was most of what a live call cost the worker (bench_live_cases)."""
    from gate_service.gateway.transport import model_client, shared_tls_context

    contexts = []
    for client in (model_client(5), model_client(5), guarded_client(timeout=5)):
        with client:
            contexts.append(client._transport._pool._ssl_context)  # type: ignore[attr-defined]
    contexts.append(GuardedAsyncTransport()._pool._ssl_context)
    assert all(context is shared_tls_context() for context in contexts)
    # Still httpx's default verification: roots loaded, hostnames checked.
    assert shared_tls_context().verify_mode.name == "CERT_REQUIRED"
    assert shared_tls_context().check_hostname
    assert shared_tls_context().cert_store_stats()["x509_ca"] > 0

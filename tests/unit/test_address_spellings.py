"""Every spelling of a link-local, unspecified, multicast or metadata address is refused when
it is set (a model route, an egress entry, an API spec's base URL, a bundle's MCP server)
and at each call, and the egress allowlist compares an address as the address it is.

getaddrinfo reads a numeric host with inet_aton's rules, so ``2852039166``, ``0xa9fea9fe``
or ``169.254.43518`` reach 169.254.169.254 while ``ipaddress`` reads none of them as an
address; endpoints.host_address reads hosts the way the resolver does, and these tests hold
it to the resolver of the machine they run on.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gate_service.api_specs import convert
from gate_service.endpoints import (
    BadUrl,
    egress_problem,
    endpoint_problem,
    host_address,
    host_allowed,
    parse_url,
    refused_address,
)
from gate_service.errors import RequestInvalid
from gate_service.gateway import ModelRoute
from gate_service.gateway.transport import RefusedAddress, guarded_client
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.gateway import Gateways, ask, post
from tests.fixtures.pages import PageServer

# 169.254.169.254 (cloud metadata), spelled as URL hosts the resolver or a client reads.
METADATA_HOSTS = [
    "169.254.169.254",
    "2852039166",  # decimal
    "0251.0376.0251.0376",  # octal
    "0xa9fea9fe",  # hex
    "0XA9FEA9FE",
    "0xa9.0xfe.0xa9.0xfe",
    "0xa9.254.0251.0xfe",  # mixed
    "169.254.43518",  # a.b.c: c fills the last 16 bits
    "169.16689662",  # a.b: b fills the last 24 bits
    "0x00a9fea9fe",  # leading zeros
    "169.254.169.254.",  # one trailing dot, which other clients drop
    "[::ffff:169.254.169.254]",  # IPv4-mapped IPv6
    "[::ffff:a9fe:a9fe]",
    "[0:0:0:0:0:ffff:a9fe:a9fe]",
    "[64:ff9b::a9fe:a9fe]",  # NAT64
]
# Other refused addresses in other spellings.
OTHER_REFUSED_HOSTS = [
    "0",  # 0.0.0.0
    "0x0",
    "[::]",
    "[fe80::1%25eth0]",  # link-local with a zone id
    "3758096385",  # 224.0.0.1, multicast
    "0xe0.1",
    "1684301000",  # 100.100.100.200, Alibaba's metadata
]
# Spellings the resolver reads as addresses that a project may use (loopback, a LAN).
ALLOWED_SPELLINGS = {
    "2130706433": "127.0.0.1",
    "127.1": "127.0.0.1",
    "0x7f.1": "127.0.0.1",
    "017700000001": "127.0.0.1",
    "10.1": "10.0.0.1",
}


def _resolver_reads(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """What getaddrinfo makes of ``host`` as a numeric host (no name server asked)."""
    try:
        infos = socket.getaddrinfo(host, 80, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        return None
    return ipaddress.ip_address(str(infos[0][4][0]).split("%", 1)[0])


@pytest.mark.parametrize(
    "host",
    [h.strip("[]").replace("%25", "%") for h in METADATA_HOSTS + OTHER_REFUSED_HOSTS]
    + list(ALLOWED_SPELLINGS)
    + ["example.com", "cafe", "0x", "1.2.3.4.5", "0x100000000", "1.2.3.256", "a.0x7f"],
)
def test_a_host_is_read_as_the_resolver_reads_it(host: str) -> None:
    read = host_address(host)
    resolved = _resolver_reads(host)
    if host.endswith(".") and resolved is None:
        # Decided: one trailing dot is dropped (getaddrinfo here takes none; other clients
        # and resolvers do), so such a host is refused as the address it names.
        resolved = _resolver_reads(host[:-1])
    if read is not None and isinstance(read, ipaddress.IPv6Address):
        read = ipaddress.IPv6Address(int(read))  # the zone id, which the resolver drops
    assert read == resolved


@pytest.mark.parametrize("host", METADATA_HOSTS + OTHER_REFUSED_HOSTS)
def test_a_route_or_base_url_at_any_spelling_of_a_refused_address_is_refused_when_set(
    host: str,
) -> None:
    url = f"http://{host}:8080/v1"
    problem = endpoint_problem(url)
    assert problem is not None, url
    if host in METADATA_HOSTS and "0251" not in host:
        assert "169.254.169.254" in problem, problem
    # An API spec's servers[0].url or base_url: a 422.
    document = {"openapi": "3.0.0", "servers": [{"url": url}], "paths": {"/a": {"get": {}}}}
    for given in (None, url):
        with pytest.raises(RequestInvalid):
            convert(document, base_url=given)


@pytest.mark.parametrize("host", METADATA_HOSTS + OTHER_REFUSED_HOSTS)
def test_an_egress_entry_at_any_spelling_of_a_refused_address_is_refused_when_set(
    host: str,
) -> None:
    entry = host.replace("%25", "%")
    problem = egress_problem(entry)
    assert problem is not None and "the gateway does not call it" in problem, problem


@pytest.mark.slow
@pytest.mark.parametrize("host", METADATA_HOSTS + OTHER_REFUSED_HOSTS)
def test_every_spelling_is_refused_at_the_call_before_connecting(host: str) -> None:
    url = f"http://{host}/latest/meta-data/"
    problem = refused_address(url)
    assert problem is not None, url
    with guarded_client(timeout=5) as client:
        # httpx refuses some spellings itself (octal), the transport the rest.
        with pytest.raises((RefusedAddress, httpx.InvalidURL)):
            client.get(url)


@pytest.mark.parametrize(
    ("host", "allowlist", "allowed"),
    [
        # An address entry allows the address in every spelling the resolver reads...
        ("2130706433", ["127.0.0.1"], True),
        ("127.1", ["127.0.0.1"], True),
        ("0x7f.0.0.1", ["127.0.0.1"], True),
        ("::ffff:127.0.0.1", ["127.0.0.1"], True),
        ("127.0.0.1", ["2130706433"], True),
        ("127.0.0.1.", ["127.0.0.1"], True),
        # ...and no other address, nor a name that resolves to it.
        ("127.0.0.2", ["127.0.0.1"], False),
        ("localhost", ["127.0.0.1"], False),
        ("127.0.0.1", ["localhost"], False),
        ("127.0.0.1", ["*.0.0.1"], False),
        # Names as before: equal, or a subdomain of a *. entry.
        ("api.example.com", ["API.example.com."], True),
        ("a.b.example.com", ["*.example.com"], True),
        ("example.com", ["*.example.com"], False),
        ("badexample.com", ["*.example.com"], False),
    ],
)
def test_the_allowlist_compares_an_address_as_the_address_it_is(
    host: str, allowlist: list[str], allowed: bool
) -> None:
    assert host_allowed(host, allowlist) is allowed


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://[::1]x/", "not a URL"),
        ("http://a b/", "to one URL parser and"),
        # Fullwidth digits, which Python's IDNA codec would make 169.254.169.254.
        ("http://\uff11\uff16\uff19.254.169.254/", "HTTP client reads"),
        ("http://0251.0376.0251.0376/", "HTTP client reads"),
        ("http://h:65536/", "not a URL"),
        ("http://h:0/", "port 0"),
        ("http://u:p@h/", "credentials"),
        ("http:///x", "with a host"),
        ("ftp://h/", "http:// or https://"),
    ],
)
def test_a_url_is_read_once_and_what_cannot_be_read_says_why(url: str, says: str) -> None:
    with pytest.raises(BadUrl) as refused:
        parse_url(url)
    assert says in str(refused.value)
    assert endpoint_problem(url) == str(refused.value)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    server = FakeProvider()
    try:
        yield server
    finally:
        server.close()


def fetch(channel: Any, url: str) -> tuple[int, dict[str, Any]]:
    body = {"url": url, "agent": "bot"}
    return post(channel.folder, body, token=channel.token, path="/v1/fetch")


@pytest.mark.slow
def test_through_the_gateway_a_spelled_metadata_address_is_never_called(
    gateways: Gateways, provider: FakeProvider
) -> None:
    # A route and an allowlist stored before they were checked: refused at each call.
    routes = [ModelRoute("meta/*", "http://0xa9fea9fe/v1")]
    channel = gateways.open(
        {"OPENAI_API_KEY": "k", "OPENAI_API_BASE": "http://169.254.43518/v1"},
        routes=routes,
        egress=["2852039166", "169.16689662"],
    )
    for model in ("meta/llama", "openai/gpt-4o"):
        status, answer = ask(channel, model=model)
        assert (status, answer["error"]["kind"]) == (424, "no_route"), answer
        assert "169.254.169.254" in answer["error"]["message"]
    for url in ("http://2852039166/latest", "http://169.16689662/latest"):
        status, answer = fetch(channel, url)
        assert (status, answer["error"]["kind"]) == (424, "no_route"), answer
        assert "169.254.169.254" in answer["error"]["message"]
    assert provider.calls == []


def test_through_the_gateway_an_allowed_address_is_reached_in_any_spelling(
    gateways: Gateways,
) -> None:
    pages = PageServer()
    try:
        channel = gateways.open({}, egress=["127.0.0.1"])
        for host in ("127.0.0.1", "2130706433", "127.1"):
            status, answer = fetch(channel, f"http://{host}:{pages.port}/page")
            assert (status, answer["status"]) == (200, 200), (host, answer)
        assert pages.paths == ["/page"] * 3
        status, answer = fetch(channel, f"http://127.0.0.2:{pages.port}/page")
        assert (status, answer["error"]["kind"]) == (424, "no_route"), answer
    finally:
        pages.close()

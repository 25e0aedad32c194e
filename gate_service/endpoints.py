"""Which endpoints a project may point the worker's model calls at (its model routes, its
``*_API_BASE`` secrets): the API checks a route when it is set, the gateway at each call.

A module of its own because both the admin API (auth) and the gateway ask it, and neither
may import the other.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit


def endpoint_problem(url: str) -> str | None:
    """What is wrong with ``url`` as an endpoint a project may send its calls to, or None.

    Any http(s) address the worker reaches is allowed (a company's proxy, a local vLLM on
    the worker's loopback), except one whose host is a link-local address: the cloud metadata
    service lives there, and a project's admin must not point the worker at it. Credentials
    in the URL are refused because routes are listed and audited, unlike secrets."""
    problem = _shape_problem(url)
    if problem is not None:
        return problem
    if urlsplit(url).query or urlsplit(url).fragment:
        return f"{url!r} must not have a query or a fragment"
    return _literal_problem(url)


def _shape_problem(url: str) -> str | None:
    """An http(s) URL with a host and a real port, and no credentials in it."""
    try:
        parts = urlsplit(url)
        if parts.port == 0:  # .port raises for one that is not a number below 65536
            return f"{url!r} has port 0"
    except ValueError as exc:
        return f"{url!r} is not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} must be an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return f"{url!r} holds credentials: name a key secret instead"
    return None


def _literal_problem(url: str) -> str | None:
    """A host written as a link-local (or otherwise refused) address."""
    try:
        address = ipaddress.ip_address(urlsplit(url).hostname or "")
    except ValueError:
        return None  # a name: checked again, resolved, at each call (refused_address)
    return _address_problem(url, [address])


# Cloud metadata services outside the link-local ranges: AWS's IPv6 address, Alibaba's.
METADATA = frozenset(
    {ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")}
)
NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[Any]:
    """The address and the IPv4 addresses it carries (mapped, 6to4, NAT64, Teredo)."""
    found: list[Any] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        found += [a for a in (address.ipv4_mapped, address.sixtofour) if a is not None]
        if address.teredo is not None:
            found.append(address.teredo[1])
        if address in NAT64:
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def _address_problem(
    url: str, addresses: Iterable[ipaddress.IPv4Address | ipaddress.IPv6Address]
) -> str | None:
    for address in addresses:
        for mapped in _embedded(address):
            if not (
                mapped.is_link_local
                or mapped.is_unspecified
                or mapped.is_multicast
                or mapped in METADATA
            ):
                continue
            return (
                f"endpoint {url} is at {address}, a link-local, unspecified or multicast "
                "address (cloud metadata lives there): the gateway does not call it"
            )
    return None


def refused_address(url: str) -> str | None:
    """Why the gateway will not call ``url`` now, from what its host resolves to; None when
    it may. Resolved at each call because a name can change what it points to (a name that
    resolves later, between this check and the connection, is the remaining gap).

    A query or a fragment is no reason: a request's URL carries one (a page's search, an
    API's parameters, Azure's api-version); only a configured endpoint may not."""
    problem = _shape_problem(url) or _literal_problem(url)
    if problem is not None:
        return problem
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        infos = socket.getaddrinfo(host, parts.port or None, proto=socket.IPPROTO_TCP)
    except OSError:
        return None  # unresolvable: the call fails at the provider client, with its message
    found = []
    for info in infos:
        try:
            found.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        except ValueError:
            continue
    return _address_problem(url, found)


def egress_problem(pattern: str) -> str | None:
    """What is wrong with ``pattern`` as an egress allowlist entry, or None: a host name
    (``api.example.com``), a wildcard of one (``*.example.com``: its subdomains), or an
    address; not a URL, and not a link-local, unspecified or multicast address."""
    host = pattern.removeprefix("*.")
    if _is_address(host):
        if pattern != host:
            return f"{pattern!r}: a wildcard of an address"
        return _address_problem(pattern, [ipaddress.ip_address(host)])
    if not HOST_NAME.fullmatch(host):
        return f"{pattern!r} is not a host name, *.domain or address"
    return None


HOST_NAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?)+")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def host_allowed(host: str, allowlist: Iterable[str]) -> bool:
    """Whether ``host`` is on the allowlist: equal to an entry (case-insensitive), or a
    subdomain of a ``*.`` entry."""
    host = host.lower().rstrip(".")
    for entry in allowlist:
        entry = entry.lower().rstrip(".")
        if entry.startswith("*."):
            if host.endswith(entry[1:]) and host != entry[2:]:
                return True
        elif host == entry:
            return True
    return False

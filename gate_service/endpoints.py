"""Which endpoints a project may point the worker's model calls at (its model routes, its
``*_API_BASE`` secrets): the API checks a route when it is set, the gateway at each call.
And what else a tenant names for a request the gateway sends: a URL (``parse_url``, the one
reading of it every check uses), an egress allowlist entry (``egress_problem``,
``host_allowed``) and a header (``header_problem``).

A module of its own because both the admin API (projects) and the gateway ask it, and neither
may import the other.

Every parse here is linear in its input and uses no regular expression of its own: the API
runs them on what any project's admin sends, the gateway on what any case sends, and a
backtracking pattern once held the API's interpreter for 25 s on a 30-character allowlist
entry (tests/unit/test_linear_parsing.py).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# An allowlist entry as messages show it: a 100,000-character one is not echoed whole. (A
# URL is shown whole: it may be a secret's value, which redaction finds only whole.)
SHOWN_CHARS = 200


class BadUrl(ValueError):
    """Why a URL is refused; its text says what and why."""


@dataclass(frozen=True, slots=True)
class Url:
    """A URL read once, as every check of it (and the gateway's HTTP client) reads it."""

    text: str  # as given
    scheme: str  # http or https
    host: str  # urlsplit's hostname: lower case, brackets removed
    # The host as httpx connects to it (a non-ASCII name IDNA-encoded as httpx encodes it,
    # not as Python's socket module would): the name the call-time check resolves.
    connected_host: str
    port: int  # as written, else the scheme's
    address: Address | None  # the host read as the resolver reads it; None: a name
    query: str
    fragment: str


def shown(text: str) -> str:
    """``text`` quoted for a message, cut at SHOWN_CHARS."""
    return repr(text) if len(text) <= SHOWN_CHARS else repr(text[:SHOWN_CHARS]) + "…"


def parse_url(url: str) -> Url:
    """``url`` read once, or ``BadUrl`` saying why not: an http(s) URL with a host and a
    real port, no credentials, that httpx (the gateway's client) reads with the same host
    and port as urlsplit does. Two parsers that disagree about a URL's host would let a
    check pass on one host while the request goes to another, so such a URL is refused."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number below 65536
    except ValueError as exc:  # also "Invalid IPv6 URL" for an unclosed bracket
        raise BadUrl(f"{url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadUrl(f"{url!r} must be an http:// or https:// URL with a host")
    if port == 0:
        raise BadUrl(f"{url!r} has port 0")
    if parts.username is not None or parts.password is not None:
        raise BadUrl(f"{url!r} holds credentials: name a key secret instead")
    try:
        client = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:  # UnicodeError is a ValueError
        raise BadUrl(f"{url!r} is not a URL the gateway's HTTP client reads: {exc}") from None
    default = 443 if parts.scheme == "https" else 80
    if not _same_host(parts.hostname, client) or (port or default) != (client.port or default):
        raise BadUrl(
            f"{url!r} names host {parts.hostname!r} to one URL parser and "
            f"{client.host!r} to another: write the host plainly"
        )
    return Url(
        text=url,
        scheme=parts.scheme,
        host=parts.hostname,
        connected_host=client.raw_host.decode("ascii", "replace"),
        port=port or default,
        address=host_address(parts.hostname),
        query=parts.query,
        fragment=parts.fragment,
    )


def _same_host(hostname: str, client: httpx.URL) -> bool:
    """Whether httpx's host is urlsplit's ``hostname``: the same ASCII (httpx percent-quotes
    what is not a host character), or for a non-ASCII name the same name once httpx has
    IDNA-encoded and decoded it."""
    raw = client.raw_host.decode("ascii", "replace").lower()
    if hostname.isascii():
        return raw == hostname
    return client.host.lower() == hostname


# What inet_aton reads: decimal, octal (0251) and hex (0xa9) parts, one to four of them.
_IPV4_CHARS = frozenset("0123456789abcdefABCDEFxX.")
# The longest non-ASCII host IDNA-encoded: four labels of 63 characters and their dots, an
# IPv4 address's most (the codec refuses a longer label; an IPv6 address is shorter).
MAX_IDNA_CHARS = 4 * 64


def host_address(host: str) -> Address | None:
    """The address ``host`` is when the resolver reads it as one, or None for a name.

    getaddrinfo reads a numeric host itself, asking no name server, with inet_aton's rules:
    ``2852039166``, ``0251.0376.0251.0376``, ``0xa9fea9fe``, ``0xa9.0xfe.0xa9.0xfe``,
    ``169.254.43518`` and ``169.16689662`` are all 169.254.169.254, which ipaddress reads
    as none. So this reads IPv4 with inet_aton itself (after one trailing dot, which other
    clients drop), IPv6 with ipaddress (brackets and a zone id removed), and a non-ASCII
    host as Python's socket module hands it to getaddrinfo (IDNA: fullwidth digits are
    digits)."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not text.isascii():
        if len(text) > MAX_IDNA_CHARS:
            # The codec takes quadratic time (punycode), and refuses a label over 63
            # characters anyway: no longer text is a host Python's socket can resolve.
            return None
        try:
            text = text.encode("idna").decode("ascii")
        except UnicodeError:
            return None  # no resolver is asked for it either
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text.split("%", 1)[0])
        except ValueError:
            return None
    if text.endswith("."):
        text = text[:-1]
    if not text or not all(c in _IPV4_CHARS for c in text):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None  # a name such as "cafe" or "0x": resolved as a name, if at all


def canonical_address(address: Address) -> Address:
    """One spelling of an address: an IPv4-mapped IPv6 address is its IPv4 address (the
    same destination), and an IPv6 address loses its zone id."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        return ipaddress.IPv6Address(int(address))
    return address


def endpoint_problem(url: str) -> str | None:
    """What is wrong with ``url`` as an endpoint a project may send its calls to, or None.

    Any http(s) address the worker reaches is allowed (a company's proxy, a local vLLM on
    the worker's loopback), except one whose host is a link-local address: the cloud metadata
    service lives there, and a project's admin must not point the worker at it. Credentials
    in the URL are refused because routes are listed and audited, unlike secrets."""
    try:
        parsed = parse_url(url)
    except BadUrl as exc:
        return str(exc)
    if parsed.query or parsed.fragment:
        return f"{url!r} must not have a query or a fragment"
    return _literal_problem(parsed)


def _literal_problem(parsed: Url) -> str | None:
    """A host written as a link-local (or otherwise refused) address, in any spelling."""
    if parsed.address is None:
        return None  # a name: checked again, resolved, at each call (refused_address)
    return _address_problem(parsed.text, [parsed.address])


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
            # The address it carries, too, when that is the refused one (::ffff:a9fe:a9fe).
            carried = f" (carrying {mapped})" if mapped != address else ""
            return (
                f"endpoint {url} is at {address}{carried}, a link-local, unspecified or "
                "multicast address (cloud metadata lives there): the gateway does not call it"
            )
    return None


def url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as one the gateway would call, without resolving it (a
    bundle's MCP server, when the bundle is validated), or None: refused_address's checks
    but the name's resolution, which is made at each call."""
    try:
        parsed = parse_url(url)
    except BadUrl as exc:
        return str(exc)
    return _literal_problem(parsed)


def refused_address(url: str) -> str | None:
    """Why the gateway will not call ``url`` now, from what its host resolves to; None when
    it may. Resolved at each call because a name can change what it points to (a name that
    resolves later, between this check and the connection, is the remaining gap).

    A query or a fragment is no reason: a request's URL carries one (a page's search, an
    API's parameters, Azure's api-version); only a configured endpoint may not."""
    try:
        parsed = parse_url(url)
    except BadUrl as exc:
        return str(exc)
    problem = _literal_problem(parsed)
    if problem is not None:
        return problem
    try:
        infos = socket.getaddrinfo(parsed.connected_host, parsed.port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):  # UnicodeError: a label IDNA refuses (over 63 characters)
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
    address in any spelling the resolver reads (``host_address``); not a URL, and not a
    link-local, unspecified or multicast address."""
    host = pattern.removeprefix("*.")
    address = host_address(host)
    if address is not None:
        if pattern != host:
            return f"{shown(pattern)}: a wildcard of an address"
        return _address_problem(pattern, [address])
    why = _name_problem(host)
    if why is not None:
        return f"{shown(pattern)} is not a host name, *.domain or address: {why}"
    return None


# A DNS label's characters (and "_", which service names use); "-" neither first nor last.
LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
MAX_NAME_CHARS = 253
MAX_LABEL_CHARS = 63


def _name_problem(host: str) -> str | None:
    """Why ``host`` is not a host name (labels of 1 to 63 letters, digits, '_' or '-' not at
    either end, joined by dots, at most 253 characters, one trailing dot allowed), or None.
    Plain string tests, label by label: linear in ``host`` whatever it holds."""
    if not host or len(host) > MAX_NAME_CHARS:
        return f"a name has 1 to {MAX_NAME_CHARS} characters"
    for label in (host[:-1] if host.endswith(".") else host).split("."):
        if not 1 <= len(label) <= MAX_LABEL_CHARS:
            return f"each label (between dots) has 1 to {MAX_LABEL_CHARS} characters"
        if not all(c in LABEL_CHARS for c in label):
            return "a label holds only letters, digits, '_' and '-'"
        if label[0] == "-" or label[-1] == "-":
            return "a label neither starts nor ends with '-'"
    return None


def host_allowed(host: str, allowlist: Iterable[str]) -> bool:
    """Whether ``host`` is on the allowlist: equal to an entry (case-insensitive), or a
    subdomain of a ``*.`` entry. An address is compared as the address it is, whichever way
    either side spells it (an entry ``127.0.0.1`` allows ``2130706433`` and ``127.1``, the
    same destination); an address never matches a name, nor a name an address."""
    address = host_address(host)
    wanted = canonical_address(address) if address is not None else None
    host = host.lower().rstrip(".")
    for entry in allowlist:
        entry_address = host_address(entry)
        if entry_address is not None or wanted is not None:
            if entry_address is not None and canonical_address(entry_address) == wanted:
                return True
            continue
        entry = entry.lower().rstrip(".")
        if entry.startswith("*."):
            if host.endswith(entry[1:]) and host != entry[2:]:
                return True
        elif host == entry:
            return True
    return False


# Headers no tenant value sets on a request the gateway sends (decided; docs/threat-model.md):
# the request's authority is its URL's alone, its framing and connection are
# httpx's, and nothing may name another host, client or method to a server or proxy that
# believes such headers. Compared case-insensitively; refused, never dropped, so the agent
# or admin learns which header and why.
REFUSED_HEADERS: dict[str, str] = {
    "host": "the request's host is its URL's",
    # Hop-by-hop (RFC 9110 7.6.1) and framing: a second length or a transfer coding the
    # body does not have lets a proxy in front of the server read two requests as one.
    "connection": "hop-by-hop: the connection is the gateway's",
    "keep-alive": "hop-by-hop: the connection is the gateway's",
    "proxy-connection": "hop-by-hop: the connection is the gateway's",
    "te": "hop-by-hop: the connection is the gateway's",
    "trailer": "hop-by-hop: the connection is the gateway's",
    "upgrade": "hop-by-hop: the connection is the gateway's",
    "transfer-encoding": "the body's framing is the HTTP client's",
    "content-length": "the body's framing is the HTTP client's",
    "expect": "the body's framing is the HTTP client's",
    # Another authority or client, as proxies and frameworks read them.
    "forwarded": "it names another client or host to a proxy",
    "via": "it names another client or host to a proxy",
    "x-real-ip": "it names another client or host to a proxy",
    "x-client-ip": "it names another client or host to a proxy",
    "client-ip": "it names another client or host to a proxy",
    "true-client-ip": "it names another client or host to a proxy",
    "x-cluster-client-ip": "it names another client or host to a proxy",
    "cf-connecting-ip": "it names another client or host to a proxy",
    "fastly-client-ip": "it names another client or host to a proxy",
    "x-host": "it names another client or host to a proxy",
    "x-original-host": "it names another client or host to a proxy",
    "x-http-host-override": "it names another client or host to a proxy",
    "x-original-url": "it names another path to a proxy",
    "x-rewrite-url": "it names another path to a proxy",
    # The method is the tool's (an api: tool's is its spec's).
    "x-http-method-override": "it names another method",
    "x-http-method": "it names another method",
    "x-method-override": "it names another method",
}
REFUSED_HEADER_PREFIXES: dict[str, str] = {
    "proxy-": "it speaks to a proxy (Proxy-Authorization, ...)",
    "x-forwarded-": "it names another client or host to a proxy (X-Forwarded-For, -Host, ...)",
}
# RFC 9110 5.6.2: a field name is a token. A pseudo-header (":authority") is none.
TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
MAX_HEADER_NAME_CHARS = 256


def header_name_problem(name: str) -> str | None:
    """Why no tenant value may name a header ``name``, or None when one may."""
    if not name or len(name) > MAX_HEADER_NAME_CHARS:
        return f"a header name has 1 to {MAX_HEADER_NAME_CHARS} characters"
    if not all(c in TOKEN_CHARS for c in name):
        return "a header name is a token: letters, digits and !#$%&'*+-.^_`|~ only"
    lowered = name.lower()
    why = REFUSED_HEADERS.get(lowered)
    if why is None:
        why = next((w for p, w in REFUSED_HEADER_PREFIXES.items() if lowered.startswith(p)), None)
    return None if why is None else f"the gateway does not let it be set: {why}"


def header_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a header's value, or None. Never quotes it: a value may hold
    a secret. httpx refuses CR, LF and NUL itself, but mid-call and with its own words, and
    lets other control characters through."""
    for ch in value:
        if ch in "\r\n":
            return "holds a line break (CR or LF)"
        if ch == "\x00":
            return "holds a NUL character"
        if (ch < " " and ch != "\t") or ch == "\x7f":
            return "holds a control character"
        if ch > "\x7f":
            return "holds a character that is not ASCII (httpx sends ASCII values only)"
    if value[:1] in (" ", "\t") or value[-1:] in (" ", "\t"):
        return "starts or ends with white space"
    return None


def header_problem(name: str, value: str) -> str | None:
    """Why a tenant's header ``name: value`` may not go out, naming the header, or None."""
    why = header_name_problem(name)
    if why is not None:
        return f"header {shown(name)} is refused: {why}"
    why = header_value_problem(value)
    if why is not None:
        return f"the value of header {name} {why}"
    return None

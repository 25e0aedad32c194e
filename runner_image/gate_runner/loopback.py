"""`localhost` for user code in a case container that has no network.

A case container with no network is created with Docker's NetworkDisabled (see the sandbox):
it still has its own namespace with loopback up, but the engine writes it no /etc/hosts, so
the C library cannot resolve `localhost` there and a tool that talks to a server it started
itself on "localhost" would fail where it works on any machine. Names under `localhost`
always mean the loopback addresses (RFC 6761, section 6.3), so when the system resolver
fails for one of them, the invocation's Python answers with 127.0.0.1 and ::1 instead. Any
other name, and any answer the system resolver does give, is left as it is. Programs started
as subprocesses use their own resolver and should use 127.0.0.1.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

LOOPBACK = {socket.AF_INET: "127.0.0.1", socket.AF_INET6: "::1"}

GetAddrInfo = Callable[..., list[Any]]


def is_localhost(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    name = host.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")


def _or_loopback(real: Callable[..., Any], answer: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, or ``answer`` for a localhost name that ``real`` cannot resolve (its error
    stands when ``answer`` has none either)."""

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        # Keywords too: getaddrinfo(host, port, proto=...) is how callers often write it.
        try:
            return real(host, *args, **kwargs)
        except socket.gaierror:
            answered = answer(host, *args, **kwargs) if is_localhost(host) else None
            if answered is None:
                raise
            return answered

    return resolve


def with_localhost(real: GetAddrInfo) -> GetAddrInfo:
    """``real`` (socket.getaddrinfo), answering localhost names with loopback when it fails."""

    def loopback(
        host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[Any] | None:
        found: list[Any] = []
        for fam, address in LOOPBACK.items():  # IPv4 first: IPv6 may be off in the netns
            if family in (0, socket.AF_UNSPEC, fam):
                try:
                    found += real(address, port, fam, type, proto, flags)
                except socket.gaierror:
                    pass
        return found or None

    return _or_loopback(real, loopback)


def install() -> None:
    """Make this process's socket module resolve localhost names as described above."""
    if getattr(socket.getaddrinfo, "_gate_localhost", False):
        return
    resolve = with_localhost(socket.getaddrinfo)
    resolve._gate_localhost = True  # type: ignore[attr-defined]
    ipv4 = LOOPBACK[socket.AF_INET]
    socket.getaddrinfo = resolve
    socket.gethostbyname = _or_loopback(socket.gethostbyname, lambda host: ipv4)
    socket.gethostbyname_ex = _or_loopback(socket.gethostbyname_ex, lambda host: (host, [], [ipv4]))

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


def with_localhost(real: GetAddrInfo) -> GetAddrInfo:
    """``real`` (socket.getaddrinfo), answering localhost names with loopback when it fails."""

    def getaddrinfo(
        host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[Any]:
        try:
            return real(host, port, family, type, proto, flags)
        except socket.gaierror:
            if not is_localhost(host):
                raise
            found: list[Any] = []
            for fam, address in LOOPBACK.items():  # IPv4 first: IPv6 may be off in the netns
                if family in (0, socket.AF_UNSPEC, fam):
                    try:
                        found += real(address, port, fam, type, proto, flags)
                    except socket.gaierror:
                        pass
            if not found:
                raise
            return found

    return getaddrinfo


def install() -> None:
    """Make this process's socket module resolve localhost names as described above."""
    if getattr(socket.getaddrinfo, "_gate_localhost", False):
        return
    resolve = with_localhost(socket.getaddrinfo)
    resolve._gate_localhost = True  # type: ignore[attr-defined]
    real_byname, real_byname_ex = socket.gethostbyname, socket.gethostbyname_ex

    def gethostbyname(host: str) -> str:
        try:
            return real_byname(host)
        except socket.gaierror:
            if not is_localhost(host):
                raise
            return LOOPBACK[socket.AF_INET]

    def gethostbyname_ex(host: str) -> tuple[str, list[str], list[str]]:
        try:
            return real_byname_ex(host)
        except socket.gaierror:
            if not is_localhost(host):
                raise
            return host, [], [LOOPBACK[socket.AF_INET]]

    socket.getaddrinfo = resolve
    socket.gethostbyname = gethostbyname
    socket.gethostbyname_ex = gethostbyname_ex

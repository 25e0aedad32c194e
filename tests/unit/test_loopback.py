"""`localhost` in a case container with no /etc/hosts (runner_image/gate_runner/loopback.py)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from gate_runner.loopback import is_localhost, with_localhost


def resolver_without_hosts(host: Any, port: Any, family: int = 0, *rest: Any) -> list[Any]:
    """A system resolver with no /etc/hosts and no DNS: only numeric addresses resolve."""
    return socket.getaddrinfo(host, port, family, *rest[:2], socket.AI_NUMERICHOST)


def test_localhost_names_fall_back_to_loopback_when_the_resolver_fails() -> None:
    resolve = with_localhost(resolver_without_hosts)
    with pytest.raises(socket.gaierror):
        resolver_without_hosts("localhost", 80)
    addresses = [info[4][0] for info in resolve("localhost", 80, 0, socket.SOCK_STREAM)]
    assert addresses[0] == "127.0.0.1" and set(addresses) <= {"127.0.0.1", "::1"}
    v4 = resolve(b"LocalHost.", 80, socket.AF_INET, socket.SOCK_STREAM)
    assert [info[4] for info in v4] == [("127.0.0.1", 80)]
    assert resolve("api.localhost", "443", socket.AF_INET)[0][4][0] == "127.0.0.1"


def test_other_names_and_real_answers_are_left_alone() -> None:
    resolve = with_localhost(resolver_without_hosts)
    for name in ("example.com", "localhost.example.com", "notlocalhost", "gate"):
        with pytest.raises(socket.gaierror):
            resolve(name, 80)

    def hosts_file(host: Any, port: Any, *rest: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port))]

    # A resolver that knows the name wins: the fallback acts only on a failure.
    assert with_localhost(hosts_file)("localhost", 80)[0][4] == ("10.1.2.3", 80)
    assert not is_localhost(None) and not is_localhost(8080)

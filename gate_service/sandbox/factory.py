"""Which sandbox backend a process uses: GATE_SANDBOX_BACKEND names one entry of ``BACKENDS``.

A backend is one package beside ``docker/`` that implements the port
(gate_service.sandbox.port) and its entry here, nothing else: this registry is the one list
of backend names (the setting is checked against it when a worker opens its sandbox, at
start-up), and tests/contract/test_sandbox_port.py runs against every entry. Each entry
imports its package only when chosen, so no process loads an engine library it does not use
(the API loads none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..config import Settings
from .port import NetworkPolicy, Sandbox, SandboxSettingError

__all__ = ["BACKENDS", "SandboxSettingError", "backend_names", "case_network", "open_sandbox"]


def _docker(settings: Settings) -> Sandbox:
    from .docker import DockerSandbox

    return DockerSandbox(settings)


# Backend name (GATE_SANDBOX_BACKEND) -> what opens one on these settings.
BACKENDS: Mapping[str, Callable[[Settings], Sandbox]] = {
    "docker": _docker,
}


def backend_names() -> list[str]:
    return sorted(BACKENDS)


def case_network(settings: Settings) -> NetworkPolicy:
    """GATE_CASE_NETWORK as the port's policy: ``none`` is no network, another value names the
    operator's network (never the host's or another container's)."""
    try:
        return NetworkPolicy.from_setting(settings.case_network)
    except ValueError as exc:
        raise SandboxSettingError(
            f"GATE_CASE_NETWORK is {settings.case_network!r}: {exc}"
        ) from None


def chosen_backend(settings: Settings) -> Callable[[Settings], Sandbox]:
    """The configured backend's entry, once the settings the port reads are checked, so a
    typo stops a worker at start-up (opening its sandbox is the first thing it does)."""
    case_network(settings)
    try:
        return BACKENDS[settings.sandbox_backend]
    except KeyError:
        raise SandboxSettingError(
            f"GATE_SANDBOX_BACKEND is {settings.sandbox_backend!r}; the choices are: "
            f"{', '.join(backend_names())}"
        ) from None


def open_sandbox(settings: Settings) -> Sandbox:
    """A connection to the configured backend: one per worker, since an engine client (the
    docker SDK's HTTP session) is not safely shared between threads."""
    return chosen_backend(settings)(settings)

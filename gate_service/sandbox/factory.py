"""Which sandbox backend a process uses: GATE_SANDBOX_BACKEND, one entry per backend.

A backend is a module that implements the port (gate_service.sandbox.port) and passes
tests/contract/test_sandbox_port.py; adding one means that module, its value in
config.SandboxBackend and its entry here. Each entry imports its module only when chosen, so
no process loads an engine library it does not use (the API loads none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..config import SandboxBackend, Settings
from .port import Sandbox


def _docker(settings: Settings) -> Sandbox:
    from .docker import DockerSandbox

    return DockerSandbox(settings)


BACKENDS: Mapping[SandboxBackend, Callable[[Settings], Sandbox]] = {
    SandboxBackend.docker: _docker,
}


def open_sandbox(settings: Settings) -> Sandbox:
    """A connection to the configured backend: one per worker, since an engine client (the
    docker SDK's HTTP session) is not safely shared between threads."""
    return BACKENDS[settings.sandbox_backend](settings)

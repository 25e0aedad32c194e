"""GATE_SANDBOX_BACKEND picks the sandbox backend, and the worker sees only the port."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError

from gate_service.config import SandboxBackend, Settings
from gate_service.sandbox import BACKENDS


def test_the_default_backend_is_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATE_SANDBOX_BACKEND", raising=False)
    assert Settings().sandbox_backend is SandboxBackend.docker


def test_an_unknown_backend_stops_the_start_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATE_SANDBOX_BACKEND", "kubernetes")
    with pytest.raises(
        ValidationError, match="GATE_SANDBOX_BACKEND is 'kubernetes'; the choices are: docker"
    ):
        Settings()


def test_every_backend_a_setting_can_name_has_a_factory_entry() -> None:
    assert set(BACKENDS) == set(SandboxBackend)


def test_the_worker_imports_the_port_and_no_engine_library() -> None:
    # A fresh interpreter: this test process may have imported the Docker backend already.
    probe = textwrap.dedent(
        """
        import sys
        import gate_service.cli.server, gate_service.worker.gc, gate_service.worker.handler
        import gate_service.worker.loop
        loaded = sorted(
            m for m in sys.modules
            if m == "docker" or m.startswith(("docker.", "gate_service.sandbox.docker"))
        )
        print(loaded)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"

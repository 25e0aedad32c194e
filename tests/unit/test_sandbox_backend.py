"""GATE_SANDBOX_BACKEND picks the sandbox backend from the factory's registry, the worker sees
only the port, and the port's policies are checked when a worker opens its sandbox."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gate_runner import gateway_wire
from gate_service.config import Settings
from gate_service.sandbox import (
    BACKENDS,
    NO_NETWORK,
    ModelChannel,
    NetworkPolicy,
    SandboxSettingError,
    case_network,
    chosen_backend,
    open_sandbox,
)


def test_the_default_backend_is_docker_and_in_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATE_SANDBOX_BACKEND", raising=False)
    assert Settings().sandbox_backend == "docker"
    assert chosen_backend(Settings()) is BACKENDS["docker"]


def test_an_unknown_backend_stops_the_start_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before any engine is asked: opening the sandbox is a worker's first act at start-up.
    monkeypatch.setenv("GATE_SANDBOX_BACKEND", "kubernetes")
    with pytest.raises(
        SandboxSettingError, match="GATE_SANDBOX_BACKEND is 'kubernetes'; the choices are: docker"
    ):
        open_sandbox(Settings())


def test_a_backend_is_its_factory_entry_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    # A name added to the registry is a backend the setting can choose: no other list of
    # names exists (the contract suite, tests/contract/test_sandbox_port.py, runs on each).
    opened: list[Settings] = []

    def other(settings: Settings) -> object:
        opened.append(settings)
        return "other sandbox"

    monkeypatch.setitem(BACKENDS, "other", other)  # type: ignore[arg-type]
    settings = Settings(sandbox_backend="other")
    assert open_sandbox(settings) == "other sandbox"
    assert opened == [settings]


@pytest.mark.parametrize("value", ["none", "", " none "])
def test_case_network_none_is_no_network(value: str) -> None:
    policy = case_network(Settings(case_network=value))
    assert policy == NO_NETWORK == NetworkPolicy()
    assert policy.isolated and policy.name is None and str(policy) == "none"


def test_case_network_otherwise_names_the_operators_network() -> None:
    policy = case_network(Settings(case_network="gate-cases"))
    assert policy == NetworkPolicy.named("gate-cases")
    assert not policy.isolated and str(policy) == "gate-cases"


@pytest.mark.parametrize("value", ["host", "container:gate-api", "container:1f2e3d"])
def test_a_case_network_sharing_a_namespace_stops_the_start(value: str) -> None:
    with pytest.raises(SandboxSettingError, match=f"GATE_CASE_NETWORK is '{value}'"):
        open_sandbox(Settings(case_network=value))
    with pytest.raises(ValueError, match="cannot be a case's network"):
        NetworkPolicy.named(value)


def test_none_is_no_name_of_a_network() -> None:
    with pytest.raises(ValueError, match="no network at all"):
        NetworkPolicy.named("none")


def test_a_model_channel_is_the_gateways_socket_in_a_folder_of_its_own(tmp_path: Path) -> None:
    channel = ModelChannel.in_folder(tmp_path)
    assert channel.socket == tmp_path / gateway_wire.SOCKET_NAME
    assert channel.folder == tmp_path


@pytest.mark.slow
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

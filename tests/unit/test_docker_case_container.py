"""The Docker backend maps the port's policies onto a case container: the network policy is its
network mode, the model channel a read-only bind mount of the channel's folder, and the
hardening is the same whatever either is (the e2e tests see them on the real engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gate_runner import gateway_wire
from gate_service.sandbox import LABEL, NO_NETWORK, ModelChannel, NetworkPolicy, RunLimits
from gate_service.sandbox.docker.cases import case_container
from gate_service.sandbox.docker.engine import engine_runtime
from gate_service.sandbox.factory import SandboxSettingError

LIMITS = RunLimits(
    memory_mb=512, cpus=1.5, pids=128, wall_seconds=60, tmpfs_mb=64, output_limit_bytes=4096
)
ARGV = ["-m", "gate_runner", "--handoff"]


def hardening(host: dict[str, Any]) -> dict[str, Any]:
    """The host config's hardening and limits, as the engine's API receives them."""
    return {
        "cap_drop": host["cap_drop"],
        "cap_add": host["cap_add"],
        "security_opt": host["security_opt"],
        "init": host["init"],
        "ulimits": [(u.name, u.soft, u.hard) for u in host["ulimits"]],
        "read_only": host["read_only"],
        "tmpfs": host["tmpfs"],
        "pids_limit": host["pids_limit"],
        "mem_limit": host["mem_limit"],
        "memswap_limit": host["memswap_limit"],
        "nano_cpus": host["nano_cpus"],
        "log_config": (host["log_config"]["Type"], host["log_config"]["Config"]),
    }


HARDENED = {
    "cap_drop": ["ALL"],
    "cap_add": ["SETUID", "SETGID", "KILL"],
    "security_opt": ["no-new-privileges"],
    "init": True,
    "ulimits": [("nofile", 1024, 1024), ("core", 0, 0), ("fsize", 64 << 20, 64 << 20)],
    "read_only": True,
    "tmpfs": {"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"},
    "pids_limit": 128,
    "mem_limit": "512m",
    "memswap_limit": "512m",
    "nano_cpus": 1_500_000_000,
    "log_config": ("json-file", {"max-size": "4096", "max-file": "1"}),
}


def test_no_network_is_network_mode_none_with_networking_disabled() -> None:
    assert LIMITS.network == NO_NETWORK  # the default
    host, create = case_container(
        ARGV, limits=LIMITS, labels={"gate.case_id": "c"}, model_channel=None
    )
    assert (host["network_mode"], create["network_disabled"]) == ("none", True)
    assert host["mounts"] == []
    assert hardening(host) == HARDENED
    assert create == {
        "command": ARGV,
        "user": "0:0",
        "network_disabled": True,
        "labels": {LABEL: "case", "gate.case_id": "c"},
        "stdin_open": True,
        "working_dir": "/bundle",
    }


def test_a_named_network_is_the_containers_network_mode() -> None:
    limits = RunLimits(**{**vars(LIMITS), "network": NetworkPolicy.named("gate-cases")})
    host, create = case_container(ARGV, limits=limits, labels={}, model_channel=None)
    assert (host["network_mode"], create["network_disabled"]) == ("gate-cases", False)
    assert hardening(host) == HARDENED


def test_the_model_channel_is_its_folder_bind_mounted_read_only(tmp_path: Path) -> None:
    channel = ModelChannel.in_folder(tmp_path)
    host, create = case_container(ARGV, limits=LIMITS, labels={}, model_channel=channel)
    (mount,) = host["mounts"]
    assert dict(mount) == {
        "Target": gateway_wire.SOCKET_DIR,
        "Source": str(tmp_path),
        "Type": "bind",
        "ReadOnly": True,
    }
    assert (host["network_mode"], create["network_disabled"]) == ("none", True)
    assert hardening(host) == HARDENED


def test_a_channel_whose_socket_the_runner_would_not_find_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=gateway_wire.SOCKET_NAME):
        case_container(
            ARGV, limits=LIMITS, labels={}, model_channel=ModelChannel(tmp_path / "other.sock")
        )


def test_a_case_runtime_is_the_containers_runtime_and_none_leaves_the_engines() -> None:
    host, _ = case_container(ARGV, limits=LIMITS, labels={}, model_channel=None, runtime="runsc")
    assert host["runtime"] == "runsc"
    assert hardening(host) == HARDENED  # gVisor is a second wall, not instead of the first
    host, _ = case_container(ARGV, limits=LIMITS, labels={}, model_channel=None)
    assert "runtime" not in host


def test_guest_tasks_are_the_containers_nproc_ulimit() -> None:
    limits = RunLimits(**{**LIMITS.__dict__, "pids": 1088, "guest_tasks": 16})
    host, _ = case_container(ARGV, limits=limits, labels={}, model_channel=None, runtime="runsc")
    assert hardening(host) == {
        **HARDENED,
        "pids_limit": 1088,
        "ulimits": [*HARDENED["ulimits"], ("nproc", 16, 16)],
    }


def test_a_runtime_the_engine_lacks_stops_the_worker_saying_how_to_register_it() -> None:
    info = {"DefaultRuntime": "runc", "Runtimes": {"runc": {"path": "runc"}}}
    assert engine_runtime(info, None) == "runc"
    assert engine_runtime({**info, "Runtimes": {"runc": {}, "runsc": {}}}, "runsc") == "runsc"
    with pytest.raises(SandboxSettingError) as refused:
        engine_runtime(info, "runsc")
    said = str(refused.value)
    assert "GATE_CASE_RUNTIME is 'runsc'" in said and "it has: runc" in said
    assert '"runtimeArgs": ["--network=none", "--fsgofer-host-uds"]' in said
    with pytest.raises(SandboxSettingError, match="it has: none"):
        engine_runtime({}, "kata")

"""Defaults of settings that depend on the machine."""

from __future__ import annotations

import os

import pytest

from gate_service import config
from gate_service.config import MAX_AUTO_CASE_CONTAINERS, MIB, Settings
from gate_service.gateway.channel import MAX_PROCESS_CONNECTIONS


def test_case_concurrency_defaults_to_the_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATE_CASE_CONCURRENCY", raising=False)
    assert Settings().case_concurrency == (os.cpu_count() or 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert Settings().case_concurrency == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one at a time
    assert Settings().case_concurrency == 1


def test_case_concurrency_stays_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATE_CASE_CONCURRENCY", "3")
    assert Settings().case_concurrency == 3
    monkeypatch.setenv("GATE_CASE_CONCURRENCY", "0")
    with pytest.raises(ValueError, match="case_concurrency"):
        Settings()


def test_case_containers_default_to_what_half_the_memory_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATE_MAX_CASE_CONTAINERS", raising=False)
    monkeypatch.delenv("GATE_CASE_MEMORY_MB", raising=False)
    gib = 1024 * MIB
    settings = Settings(case_concurrency=2)
    monkeypatch.setattr(config, "machine_pid_max", lambda: 4_194_304)  # 64-bit Linux's most
    # 23 GiB at 512 MiB a case: 23 containers, past 8 times the case slots (no such cap now).
    monkeypatch.setattr(config, "machine_memory_bytes", lambda: 23 * gib)
    assert settings.containers_memory_holds() == 23
    assert settings.case_container_limit() == 23
    # A small machine: still as many as the case slots.
    monkeypatch.setattr(config, "machine_memory_bytes", lambda: gib)
    assert settings.case_container_limit() == 2
    # A large one: at most what the gateway's connections of one worker process serve.
    monkeypatch.setattr(config, "machine_memory_bytes", lambda: 1024 * gib)
    assert settings.case_container_limit() == MAX_AUTO_CASE_CONTAINERS
    assert MAX_AUTO_CASE_CONTAINERS == MAX_PROCESS_CONNECTIONS
    # Memory not known: the case slots.
    monkeypatch.setattr(config, "machine_memory_bytes", lambda: None)
    assert settings.containers_memory_holds() is None
    assert settings.case_container_limit() == 2


def test_case_containers_stay_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "machine_memory_bytes", lambda: 1024 * 1024 * MIB)
    assert Settings(case_concurrency=2, max_case_containers=500).case_container_limit() == 500
    # Never fewer than the case slots.
    assert Settings(case_concurrency=4, max_case_containers=1).case_container_limit() == 4


def _machine_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test gives: none of the machine's GATE_ settings that these read."""
    for name in (
        "GATE_CASE_RUNTIME",
        "GATE_CASE_GVISOR_TASKS",
        "GATE_CASE_PIDS_LIMIT",
        "GATE_MAX_CASE_CONTAINERS",
        "GATE_CASE_MEMORY_MB",
    ):
        monkeypatch.delenv(name, raising=False)


def test_case_containers_are_bounded_by_a_quarter_of_the_hosts_pid_max(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pids are one table for the whole machine: cases that filled it would stop every
    process on it (the engine, Postgres, the gate) from forking. A quarter, since a project
    under its fair share may take twice a worker's slots for a while (worker/slots.py)."""
    _machine_settings(monkeypatch)
    monkeypatch.setattr(config, "machine_memory_bytes", lambda: 1024 * 1024 * MIB)
    monkeypatch.setattr(config, "machine_pid_max", lambda: 32_768)
    runc = Settings(case_concurrency=2, case_pids_limit=256)
    assert runc.containers_pids_hold() == 32  # 8,192 / 256
    assert runc.case_container_limit() == 32
    # Under gVisor a case's host tasks are 4 n^2 + 64 of its guest tasks (16: 1,088).
    gvisor = Settings(case_concurrency=2, case_pids_limit=256, case_runtime="runsc")
    assert gvisor.case_host_pids() == 1088
    assert gvisor.case_container_limit() == 7
    # The sandbox's runtime decides, not only the setting: an engine whose default is runsc.
    assert runc.case_container_limit("runsc") == 7 and runc.case_host_pids("runsc") == 1088
    assert runc.case_container_limit("runc") == 32
    # The pid bound wins over the case slots' floor: 64 slots at 1,088 would be 69,632 pids.
    many = Settings(case_concurrency=64, case_runtime="runsc")
    assert many.case_container_limit() == 7
    # At least one; and pid_max unknown, memory alone decides.
    monkeypatch.setattr(config, "machine_pid_max", lambda: 1000)
    assert gvisor.containers_pids_hold() == 1
    assert gvisor.case_container_limit() == 1
    monkeypatch.setattr(config, "machine_pid_max", lambda: None)
    assert gvisor.containers_pids_hold() is None
    assert gvisor.case_container_limit() == MAX_AUTO_CASE_CONTAINERS


def test_guest_tasks_are_held_only_under_gvisor(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLIMIT_NPROC counts a uid's tasks machine-wide on the host's kernel, and every case's
    code runs as the same uid, so under runc it would let cases starve each other."""
    _machine_settings(monkeypatch)
    runc = Settings(case_pids_limit=300)
    assert (runc.case_guest_tasks(), runc.case_host_pids()) == (None, 300)
    assert (runc.case_guest_tasks("runc"), runc.case_host_pids("runc")) == (None, 300)
    gvisor = Settings(case_pids_limit=300, case_runtime="runsc", case_gvisor_tasks=8)
    assert (gvisor.case_guest_tasks(), gvisor.case_host_pids()) == (8, 320)  # 4*64+64
    gvisor = Settings(case_runtime="runsc", case_gvisor_tasks=32)
    assert (gvisor.case_guest_tasks(), gvisor.case_host_pids()) == (32, 4160)
    # runsc's variants by name; another name is not recognised.
    assert config.is_gvisor("runsc-kvm") and not config.is_gvisor("runscx")
    assert not config.is_gvisor("runc") and not config.is_gvisor(None)
    monkeypatch.setenv("GATE_CASE_GVISOR_TASKS", "65")
    with pytest.raises(ValueError, match="case_gvisor_tasks"):
        Settings()


def test_a_case_containers_limits_follow_the_sandboxs_runtime(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker hands the sandbox's runtime (GATE_CASE_RUNTIME, or the engine's default)
    to case_limits: under gVisor its code's tasks are held, and its host pids sized."""
    from gate_service.worker.handler import case_limits

    _machine_settings(monkeypatch)
    settings = Settings()
    runc = case_limits(settings, 60, "runc")
    assert (runc.pids, runc.guest_tasks) == (256, None)
    gvisor = case_limits(settings, 60, "runsc")
    assert (gvisor.pids, gvisor.guest_tasks) == (1088, 16)
    assert case_limits(Settings(case_runtime="runsc"), 60).guest_tasks == 16

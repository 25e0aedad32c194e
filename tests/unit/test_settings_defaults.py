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

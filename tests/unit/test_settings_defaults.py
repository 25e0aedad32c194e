"""Defaults of settings that depend on the machine."""

from __future__ import annotations

import os

import pytest

from gate_service.config import Settings


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

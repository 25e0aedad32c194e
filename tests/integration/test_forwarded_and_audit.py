"""The failure brake counts the real peer, and refusals write a bounded audit (trust-2, item 8).

Through a real `gate api` (uvicorn: it is uvicorn that believes X-Forwarded-For, by default
from 127.0.0.1): a client on loopback that rotates the header is still braked, unless the
operator names that address in GATE_TRUSTED_PROXIES. However many addresses the refusals
come from, one process writes at most GATE_AUTH_FAILURE_AUDIT_LIMIT rows per window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gate_service.auth.brakes import AuditBudget
from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.ports import free_port

LIMIT = 5
ATTEMPTS = 30


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[Callable[..., str]]:
    procs = []

    def run(**settings: str) -> str:
        port = free_port()
        data_dir = tmp_path / str(port)
        data_dir.mkdir()
        proc, log_path = start(
            "api",
            data_dir,
            GATE_DATABASE_URL=database_url,
            GATE_PORT=str(port),
            GATE_AUTH_FAILURE_LIMIT=str(LIMIT),
            **settings,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, log_path)
        return url

    try:
        yield run
    finally:
        for proc in procs:
            stop(proc)


def rotate(url: str) -> list[int]:
    """A bad token, each time from a new address in X-Forwarded-For."""
    with httpx.Client(base_url=url, timeout=30) as client:
        return [
            client.get(
                "/v1/gates",
                headers={**bearer("not-a-token"), "X-Forwarded-For": f"203.0.113.{i}"},
            ).status_code
            for i in range(ATTEMPTS)
        ]


def rejected_rows(url: str) -> list[dict[str, object]]:
    with httpx.Client(base_url=url, headers=bearer(ADMIN_TOKEN), timeout=30) as client:
        answer = client.get("/v1/audit", params={"action": "token.rejected", "limit": 500})
        assert answer.status_code == 200, answer.text
        return list(answer.json()["items"])


def test_a_rotated_forwarded_for_does_not_escape_the_brake(api: Callable[..., str]) -> None:
    codes = rotate(api())
    assert codes[:LIMIT] == [401] * LIMIT
    assert set(codes[LIMIT:]) == {429}


def test_forwarded_for_counts_only_from_a_named_proxy(api: Callable[..., str]) -> None:
    # Loopback is the operator's proxy here: each forwarded address is braked on its own.
    url = api(GATE_TRUSTED_PROXIES="127.0.0.1", GATE_AUTH_FAILURE_AUDIT_LIMIT="3")
    assert rotate(url) == [401] * ATTEMPTS
    # ... and thirty addresses wrote three rows, not thirty.
    rows = rejected_rows(url)
    assert len(rows) == 3, rows
    assert all(row["detail"] == {"why": "unknown"} for row in rows)


def test_the_row_after_a_full_budget_says_how_many_were_left_out() -> None:
    now = [0.0]
    budget = AuditBudget(2, 60, clock=lambda: now[0])
    assert [budget.take() for _ in range(5)] == [0, 0, None, None, None]
    now[0] = 61.0  # the window has passed
    assert budget.take() == 3
    assert budget.take() == 0
    assert budget.take() is None

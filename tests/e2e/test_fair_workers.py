"""Fair shares of a worker between projects, through the real service (issue 17 item 6).

`gate serve` on a database of this test's own, with the real Docker engine: one embedded
worker of 2 gate places and 2 case slots. Before, two gates of one project whose cases
sleep held both places and both slots, and another project's one-case gate stayed `queued`
until one of them ended.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gate_service.client.api import GateClient
from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN, bearer, project_token
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.ports import free_port
from tests.fixtures.projects import AGENTS, bundle_of, write
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.docker

# The acceptance bound for the other project's gate, from its submission to its end.
BOUND_SECONDS = 15


def project(root: Path, suite: str, **files: str) -> Path:
    return write(root, {**AGENTS, "tests/suite.yaml": suite, **files})


def slow_project(root: Path) -> Path:
    """Two cases that each sleep 90 s in their container: far longer than the bound."""
    case = """
          - name: {}
            payload: '{{"a": 1, "b": 1, "sleep": 90}}'
            timeout_s: 120
    """
    suite = "agent: calc\ntests:" + case.format("sleeps_one") + case.format("sleeps_two")
    # A file of its own, so A's two gates are two bundles and never build one image at once.
    return project(root, suite, **{"tests/files/which.txt": root.name})


INSTANT = """
    agent: calc
    tests:
      - name: adds
        payload: '{"a": 2, "b": 3}'
        expected_result: output.sum == 5
"""


def running_cases(gate: dict[str, Any]) -> int:
    return sum(c["status"] == "running" for c in gate["cases"])


def test_another_projects_instant_gate_ends_while_one_projects_slow_gates_run(
    docker_engine: None, pg_server_url: str, tmp_path: Path
) -> None:
    database = create_database(pg_server_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc, log_path = start(
        "serve",
        tmp_path,
        GATE_DATABASE_URL=database,
        GATE_PORT=str(port),
        GATE_EMBEDDED_WORKERS="1",
        GATE_WORKER_GATES="2",
        GATE_CASE_CONCURRENCY="2",
        GATE_MAX_RUNNING_GATES_PER_PROJECT="2",
    )
    a_gates: list[str] = []
    alpha = beta = None
    try:
        wait_ready(url, proc, log_path)
        with httpx.Client(base_url=url, headers=bearer(ADMIN_TOKEN), timeout=60) as admin:
            a_token = project_token(admin, "alpha", ["submit", "read"])
            b_token = project_token(admin, "beta", ["submit", "read"])
        alpha, beta = GateClient(url, token=a_token), GateClient(url, token=b_token)
        instant = bundle_of(project(tmp_path / "instant", INSTANT))
        # B's image is built first, so that the bound measures scheduling, not a build.
        warm = beta.wait(beta.submit(instant)["id"], timeout_s=600)
        assert warm["status"] == "passed", warm

        a_gates = [
            alpha.submit(bundle_of(slow_project(tmp_path / f"slow{i}")))["id"] for i in (1, 2)
        ]

        def a_holds_the_worker() -> bool:
            """Both places (two running gates) and both slots (two cases in containers)."""
            gates = [alpha.gate(g) for g in a_gates]
            running = all(g["status"] == "running" for g in gates)
            return running and sum(running_cases(g) for g in gates) == 2

        wait_until(a_holds_the_worker, "A's gates holding both places and slots", seconds=600)

        submitted = time.monotonic()
        gate = beta.wait(beta.submit(instant)["id"], timeout_s=120)
        took = time.monotonic() - submitted

        assert gate["status"] == "passed", gate
        assert took < BOUND_SECONDS, f"B's one-case gate took {took:.1f} s"
        # ... while A's slow gates ran on, their cases still sleeping in their containers.
        assert a_holds_the_worker()
    finally:
        for gate_id in a_gates:  # end the sleeping containers now, not in 90 s
            assert alpha is not None
            try:
                alpha.cancel(gate_id)
            except Exception as exc:  # the service may be down already; stop() follows
                print(f"cancelling {gate_id}: {exc}")
        for c in (alpha, beta):
            if c is not None:
                c.close()
        stop(proc)
        drop_database(pg_server_url, database)

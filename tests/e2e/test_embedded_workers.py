"""`gate serve`'s workers run in a process of their own (trust-2, item 2).

Through a real `gate serve` and the real engine: a worker process that cannot run (stopped
with SIGSTOP, as a worker step stuck in a long computation would be for the API when both
shared one interpreter) leaves `/healthz`, submissions and reads answering; a worker process
that dies is replaced; its observations still reach the API's /metrics; and it ends with
serve.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gate_service.client.api import GateClient
from tests.e2e.conftest import running, stop
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.docker


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie its new parent has not reaped yet."""
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def worker_of(serve_pid: int) -> int | None:
    for pid in children(serve_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and b"--parent-pid" in argv:
            return pid
    return None


@pytest.fixture
def serve(
    docker_engine: None, pg_server_url: str, gate_url: str, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """``gate_url`` first: its serve has prepared the images, so this one starts quickly."""
    database = create_database(pg_server_url)
    try:
        with running("serve", tmp_path, GATE_DATABASE_URL=database) as serve:
            pid = serve.proc.pid
            wait_until(lambda: worker_of(pid) is not None, "serve starts its worker", seconds=60)
            yield {"url": serve.url, "proc": serve.proc, "log": serve.log_path}
    finally:
        drop_database(pg_server_url, database)


def test_a_stopped_worker_process_cannot_stall_the_api(
    serve: dict[str, Any], tmp_path: Path
) -> None:
    worker = worker_of(serve["proc"].pid)
    assert worker is not None and worker != serve["proc"].pid
    # Ready means a worker can claim (issue 43): serve's /readyz counts it, and said so.
    assert httpx.get(f"{serve['url']}/readyz", timeout=5).json()["workers"] == 1
    wait_until(lambda: "ready on http://" in serve["log"].read_text(), "the ready line", seconds=10)
    client = GateClient(serve["url"], token=ADMIN_TOKEN)
    http = httpx.Client(base_url=serve["url"], headers=bearer(ADMIN_TOKEN), timeout=10)
    os.kill(worker, signal.SIGSTOP)
    try:
        # Every answer comes while the worker cannot run at all.
        for _ in range(20):
            assert http.get("/healthz").json() == {"status": "ok"}
        gate = client.submit(bundle_of(calculator_project(tmp_path / "p", failing=False)))
        assert http.get(f"/v1/gates/{gate['id']}").json()["status"] == "queued"
        assert http.get("/readyz").status_code == 200
    finally:
        os.kill(worker, signal.SIGCONT)
    try:
        assert client.wait(gate["id"], timeout_s=600)["status"] == "passed"
        # The worker's observations reached the API's registry over the relay.
        text = http.get("/metrics").text
        counts = [
            line for line in text.splitlines()
            if line.startswith('gate_case_duration_seconds_count{status="passed"}')
        ]  # fmt: skip
        assert counts and float(counts[0].split()[-1]) >= 1, text[-2000:]
        assert 'gate_duration_seconds_count{status="passed"} 1.0' in text
    finally:
        http.close()
        client.close()


def test_a_dead_worker_process_is_replaced_and_ends_with_serve(
    serve: dict[str, Any], tmp_path: Path
) -> None:
    first = worker_of(serve["proc"].pid)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(
        lambda: worker_of(serve["proc"].pid) not in (None, first),
        "serve starts another worker process",
        seconds=60,
    )
    second = worker_of(serve["proc"].pid)
    # Ready again once the new process's worker can claim: it counts that one, not the dead.
    wait_until(
        lambda: httpx.get(f"{serve['url']}/readyz", timeout=5).status_code == 200,
        "readyz answers 200 for the new worker",
        seconds=60,
    )
    assert httpx.get(f"{serve['url']}/readyz", timeout=5).json() == {
        "status": "ready",
        "workers": 1,
    }
    client = GateClient(serve["url"], token=ADMIN_TOKEN)
    try:
        gate = client.submit(bundle_of(calculator_project(tmp_path / "p", failing=True)))
        assert client.wait(gate["id"], timeout_s=600)["status"] == "failed"
    finally:
        client.close()
    assert "exited with code -9; starting another" in serve["log"].read_text()
    stop(serve["proc"])
    assert second is not None and gone(second)


def test_the_worker_process_ends_when_serve_is_killed(
    serve: dict[str, Any],
) -> None:
    worker = worker_of(serve["proc"].pid)
    assert worker is not None
    serve["proc"].kill()  # no cleanup runs: the child learns through PR_SET_PDEATHSIG
    serve["proc"].wait()
    wait_until(lambda: gone(worker), "the worker process ends", seconds=60)

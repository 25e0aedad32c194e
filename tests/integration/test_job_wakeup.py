"""Idle workers woken by LISTEN gate_jobs (migration 0005), on a real Postgres.

Each worker here polls only every POLL_SECONDS, far beyond DEADLINE_SECONDS: a gate taken
within the deadline was taken because a notification woke the worker, not by its poll.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gate_service import jobs
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.worker.handler import WorkerContext
from gate_service.worker.loop import Worker
from gate_service.worker.wakeup import JobWakeup
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.sandbox import FakeSandbox
from tests.fixtures.waiting import wait_until
from tests.integration.test_fair_scheduling import cases_project, project_b

POLL_SECONDS = 600.0
DEADLINE_SECONDS = 60.0
QUIET_SECONDS = 1.5  # how long a notification that must not come is waited for


@pytest.fixture
def stop() -> threading.Event:
    return threading.Event()


@pytest.fixture
def wakeup(database_url: str, stop: threading.Event) -> Iterator[JobWakeup]:
    jobs = JobWakeup(database_url, stop)
    jobs.start()
    assert jobs.listening.wait(DEADLINE_SECONDS), "the wake-up listener did not connect"
    try:
        yield jobs
    finally:
        stop.set()
        jobs.join(DEADLINE_SECONDS)


@pytest.fixture
def idle_worker(
    settings: Settings,
    sessions: sessionmaker[Session],
    sandbox: FakeSandbox,
    wakeup: JobWakeup,
    stop: threading.Event,
) -> Iterator[tuple[Worker, threading.Thread]]:
    """A worker running in its thread, waiting for work, that polls only every 10 minutes."""
    ctx = WorkerContext(
        settings=settings.model_copy(update={"worker_poll_seconds": POLL_SECONDS}),
        sessions=sessions,
        sandbox=sandbox,
        stop=stop,
        jobs=wakeup,
    )
    worker = Worker(ctx, name="wakeup-worker")
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert worker.idle.wait(DEADLINE_SECONDS), "the worker never went idle"
    try:
        yield worker, thread
    finally:
        stop.set()
        thread.join(DEADLINE_SECONDS)


def submit(client: TestClient, data: bytes) -> str:
    response = client.post("/v1/gates", files={"bundle": ("b.tgz", data)})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_an_idle_worker_takes_a_new_gate_at_once_not_at_its_next_poll(
    client: TestClient, idle_worker: tuple[Worker, threading.Thread], tmp_path: Path
) -> None:
    worker, _ = idle_worker
    gate_id = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    wait_until(
        lambda: client.get(f"/v1/gates/{gate_id}").json()["phase"] == "done",
        "the gate is judged",
        seconds=DEADLINE_SECONDS,
    )
    assert client.get(f"/v1/gates/{gate_id}").json()["status"] == "passed"
    # ...and the worker went back to waiting, then takes the next one just as soon.
    wait_until(worker.idle.is_set, "the worker is idle again", seconds=DEADLINE_SECONDS)
    second = submit(client, bundle_of(calculator_project(tmp_path / "q", failing=True)))
    wait_until(
        lambda: client.get(f"/v1/gates/{second}").json()["phase"] == "done",
        "the second gate is judged",
        seconds=DEADLINE_SECONDS,
    )


def test_a_worker_holding_a_large_gate_takes_a_new_small_one_at_once(
    client: TestClient, idle_worker: tuple[Worker, threading.Thread], tmp_path: Path
) -> None:
    worker, _ = idle_worker
    assert worker.ctx.settings.worker_gates == 2
    large = submit(client, bundle_of(cases_project(tmp_path / "large", 200)))
    wait_until(
        lambda: client.get(f"/v1/gates/{large}").json()["status"] == "running",
        "the large gate runs",
        seconds=DEADLINE_SECONDS,
    )
    # The worker holds the large gate and waits on its poll interval for anything else: only
    # the notification of the new job can make it take the small one before the large ends.
    other = project_b(client)
    small = submit(other, bundle_of(cases_project(tmp_path / "small", 2)))
    wait_until(
        lambda: other.get(f"/v1/gates/{small}").json()["phase"] == "done",
        "the small gate is judged",
        seconds=DEADLINE_SECONDS * 5,
    )
    assert client.get(f"/v1/gates/{large}").json()["phase"] != "done"


def test_stop_wakes_an_idle_worker(
    idle_worker: tuple[Worker, threading.Thread], stop: threading.Event
) -> None:
    _, thread = idle_worker
    stop.set()
    thread.join(DEADLINE_SECONDS)
    assert not thread.is_alive(), "the worker waited out its poll interval after stop"


def test_what_frees_a_job_notifies_and_a_claim_does_not(
    client: TestClient, sessions: sessionmaker[Session], wakeup: JobWakeup, tmp_path: Path
) -> None:
    event = threading.Event()
    with wakeup.subscribe(event):
        event.clear()
        submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
        assert event.wait(DEADLINE_SECONDS), "a queued job was not announced"
        event.clear()
        with session_scope(sessions) as session:
            job = jobs.claim(session, owner="w1", lease_seconds=60)
        assert job is not None
        # A claim frees nothing: the other workers are not all woken by every claim.
        assert not event.wait(QUIET_SECONDS), "a claim woke the workers"
        with session_scope(sessions) as session:
            job.release(session, error="handed back")
        assert event.wait(DEADLINE_SECONDS), "a job handed back was not announced"
        event.clear()
        with session_scope(sessions) as session:
            job = jobs.claim(session, owner="w1", lease_seconds=60)
            assert job is not None
        event.clear()
        with session_scope(sessions) as session:
            job.finish(session)
        # A finished job may free a place under the per-project cap.
        assert event.wait(DEADLINE_SECONDS), "a finished job was not announced"


def test_the_wakeup_reconnects_after_its_connection_is_killed(
    client: TestClient, sessions: sessionmaker[Session], wakeup: JobWakeup, tmp_path: Path
) -> None:
    killed, connects = wakeup.backend_pid, wakeup.connects
    assert killed is not None
    with session_scope(sessions) as session:
        assert session.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": killed})
    wait_until(
        lambda: wakeup.connects > connects and wakeup.listening.is_set(),
        "the listener reconnects",
        seconds=DEADLINE_SECONDS,
    )
    assert wakeup.backend_pid != killed
    event = threading.Event()
    with wakeup.subscribe(event):
        event.clear()
        submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
        assert event.wait(DEADLINE_SECONDS), "a job queued after the reconnect was not heard"

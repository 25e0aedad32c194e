"""/metrics (issue 12, item 6): state read from Postgres at scrape time, events observed by
workers sharing the app's registry (as `gate serve`'s in-process workers do), and who may read
it. Real Postgres, the app through TestClient, gates judged by the fake-sandbox worker."""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from gate_service.app_state import state_of
from gate_service.config import Settings
from gate_service.db import make_engine, make_sessionmaker
from gate_service.main import create_app
from gate_service.metrics import Metrics, RelayedMetrics, relay_into, serve_worker_metrics
from gate_service.metrics_route import DatabaseCollector
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN, as_token, bearer, project_token
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.sandbox import FakeSandbox

METRICS_TOKEN = "metrics-scrape-token-0123456789abcdef"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and labels."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def scrape(client: TestClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


def submit(client: TestClient, data: bytes) -> str:
    response = client.post("/v1/gates", files={"bundle": ("b.tgz", data)})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


@pytest.fixture
def shared(client: TestClient, worker: Worker) -> Worker:
    """The worker observes into the app's registry, as `gate serve` wires them."""
    metrics = state_of(client.app).metrics
    assert isinstance(metrics, Metrics)
    worker.ctx.metrics = metrics
    return worker


def test_a_judged_gate_shows_in_status_counts_queue_depth_and_durations(
    client: TestClient, shared: Worker, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    # The fake engine says each container took 250 ms to start.
    run = sandbox.run
    sandbox.run = lambda *a, **k: dataclasses.replace(run(*a, **k), start_ms=250)  # type: ignore[method-assign]
    data = bundle_of(calculator_project(tmp_path / "p", failing=True))
    before = scrape(client)
    assert value(before, "gate_queue_depth", project="default") == 0
    assert value(before, "gate_gates", status="failed") == 0
    assert value(before, "gate_database_up") == 1

    gate_id = submit(client, data)
    queued = scrape(client)
    assert value(queued, "gate_queue_depth", project="default") == 1
    assert value(queued, "gate_gates", status="queued") == 1

    assert shared.run_once() is True
    assert client.get(f"/v1/gates/{gate_id}").json()["status"] == "failed"
    after = scrape(client)
    assert value(after, "gate_queue_depth", project="default") == 0
    assert value(after, "gate_gates", status="queued") == 0
    assert value(after, "gate_gates", status="failed") == 1
    # Six cases: four pass and two fail (see calculator_project); the gate ends failed.
    assert value(after, "gate_case_duration_seconds_count", status="passed") == 4
    assert value(after, "gate_case_duration_seconds_count", status="failed") == 2
    assert value(after, "gate_duration_seconds_count", status="failed") == 1
    assert value(after, "gate_duration_seconds_count", status="passed") is None
    assert value(after, "gate_container_start_seconds_count") == 6
    assert value(after, "gate_container_start_seconds_sum") == pytest.approx(1.5)
    assert value(after, "gate_container_start_seconds_bucket", le="0.25") == 6
    assert value(after, "gate_container_start_seconds_bucket", le="0.1") == 0
    assert value(after, "gate_image_cache_lookups_total", result="miss") == 1
    assert value(after, "gate_image_cache_lookups_total", result="hit") is None

    # The same bundle again: its test image is there already.
    submit(client, data)
    assert shared.run_once() is True
    again = scrape(client)
    assert value(again, "gate_image_cache_lookups_total", result="hit") == 1
    assert value(again, "gate_image_cache_lookups_total", result="miss") == 1
    assert value(again, "gate_gates", status="failed") == 2
    assert value(again, "gate_duration_seconds_count", status="failed") == 2


def test_queue_depth_is_per_project_and_names_every_project(
    client: TestClient, shared: Worker, tmp_path: Path
) -> None:
    token = project_token(client, "team-a", ["submit", "read"])
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    team = as_token(client, token)
    submit(team, data)
    submit(team, data)
    submit(client, data)
    found = scrape(client)
    assert value(found, "gate_queue_depth", project="team-a") == 2
    assert value(found, "gate_queue_depth", project="default") == 1
    assert value(found, "gate_gates", status="queued") == 3


def test_reaped_containers_are_counted(
    client: TestClient, shared: Worker, sandbox: FakeSandbox
) -> None:
    gate_id = str(uuid.uuid4())
    # A case container of a gate this database does not know is another installation's: kept.
    sandbox.containers = [{"gate.gate_id": gate_id, "gate.owner": "gone"}]
    shared.reap_orphans()
    assert value(scrape(client), "gate_containers_reaped_total") == 0
    shared._reap({})  # every container of ours, as after a cancel
    assert value(scrape(client), "gate_containers_reaped_total") == 1


def test_metrics_needs_the_metrics_token_or_a_service_admin_token(
    settings: Settings, tmp_path: Path
) -> None:
    app = create_app(settings.model_copy(update={"metrics_token": SecretStr(METRICS_TOKEN)}))
    with TestClient(app, headers=bearer(ADMIN_TOKEN)) as admin:
        assert admin.get("/metrics").status_code == 200
        assert as_token(admin, METRICS_TOKEN).get("/metrics").status_code == 200
        refusals: list[tuple[str | None, int]] = [
            (None, 401),
            ("not-a-token", 401),
            (METRICS_TOKEN + "x", 401),
            # Tokens of a project: even its admin does not see other projects' names.
            (project_token(admin, "team-b", ["admin"]), 403),
            (project_token(admin, "default", ["read", "submit"]), 403),
        ]
        for token, status in refusals:
            answer = as_token(admin, token).get("/metrics")
            assert answer.status_code == status, (token, answer.text)
            body: dict[str, Any] = answer.json()
            assert set(body) == {"error", "detail", "problems"}
            assert "gate_queue_depth" not in answer.text
        # The Host check applies here as everywhere.
        assert admin.get("/metrics", headers={"Host": "evil.example"}).status_code == 400


def test_without_a_metrics_token_only_service_admins_read(client: TestClient) -> None:
    assert as_token(client, METRICS_TOKEN).get("/metrics").status_code == 401
    assert client.get("/metrics").status_code == 200


def test_the_database_collector_says_when_the_database_does_not_answer() -> None:
    engine = make_engine("postgresql://nobody@127.0.0.1:9/none")
    try:
        factory = make_sessionmaker(engine)
        families = {f.name: f for f in DatabaseCollector(lambda: factory).collect()}
    finally:
        engine.dispose()
    assert set(families) == {"gate_database_up"}
    assert [s.value for s in families["gate_database_up"].samples] == [0]
    # Before the app's lifespan made a session factory, likewise.
    (up,) = DatabaseCollector(lambda: None).collect()
    assert (up.name, [s.value for s in up.samples]) == ("gate_database_up", [0])


def test_a_lifespan_run_twice_registers_the_database_collector_once(settings: Settings) -> None:
    """As schemathesis' from_asgi does inside a TestClient: a second lifespan of one app."""
    app = create_app(settings)
    with TestClient(app, headers=bearer(ADMIN_TOKEN)) as first:
        with TestClient(app, headers=bearer(ADMIN_TOKEN)) as second:
            assert value(scrape(second), "gate_database_up") == 1
        assert value(scrape(first), "gate_database_up") == 1


def test_each_app_has_its_own_registry(settings: Settings) -> None:
    """Built with the app, never at import: observations of one app never show in another."""
    first, second = create_app(settings), create_app(settings)
    with TestClient(first), TestClient(second):  # each lifespan builds its app's state
        one, two = state_of(first).metrics, state_of(second).metrics
        one.image_lookup(hit=True)
        assert one.registry is not two.registry
        assert b'gate_image_cache_lookups_total{result="hit"} 1.0' in one.exposition()
        assert b"gate_image_cache_lookups_total{" not in two.exposition()


def test_a_standalone_worker_serves_its_own_registry(settings: Settings) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics = Metrics()
    metrics.containers_reaped(3)
    server = serve_worker_metrics(
        settings.model_copy(
            update={"worker_metrics_port": port, "worker_metrics_host": "127.0.0.1"}
        ),
        metrics,
    )
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert answer.status_code == 200
    assert value(samples(answer.text), "gate_containers_reaped_total") == 3


def test_a_relayed_worker_process_observes_into_the_apis_registry() -> None:
    # gate serve's worker process: each observation crosses a pipe into the API's Metrics.
    read_end, write_end = os.pipe()
    api = Metrics(process=False)
    reader = relay_into(api, read_end)
    worker = RelayedMetrics(write_end)
    worker.image_lookup(hit=False)
    worker.container_started(250)
    worker.containers_reaped(2)
    worker.record("case", "failed", 1.5)
    worker.record("no-such-kind", 1)  # dropped, with a warning, not a crash
    worker._out.close()  # the worker process ends: the relay ends with it
    reader.join(timeout=10)
    assert not reader.is_alive()
    found = samples(api.exposition().decode())
    assert value(found, "gate_image_cache_lookups_total", result="miss") == 1
    assert value(found, "gate_container_start_seconds_count") == 1
    assert value(found, "gate_container_start_seconds_sum") == 0.25
    assert value(found, "gate_containers_reaped_total") == 2
    assert value(found, "gate_case_duration_seconds_count", status="failed") == 1


def test_time_in_the_queue_is_observed_for_started_and_for_cancelled_unstarted_gates(
    client: TestClient, shared: Worker, tmp_path: Path
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    never = submit(client, data)
    assert client.post(f"/v1/gates/{never}/cancel").json()["status"] == "cancelled"
    found = scrape(client)
    assert value(found, "gate_queued_seconds_count", outcome="cancelled") == 1
    assert value(found, "gate_queued_seconds_count", outcome="started") is None
    # Cancelled before it started: no start-to-verdict time, since there was none.
    assert value(found, "gate_duration_seconds_count", status="cancelled") is None

    judged = submit(client, data)
    assert shared.run_once() is True
    assert client.get(f"/v1/gates/{judged}").json()["status"] == "passed"
    found = scrape(client)
    assert value(found, "gate_queued_seconds_count", outcome="started") == 1
    # Cancelling a gate that has ended, or that started, adds no queue time.
    assert client.post(f"/v1/gates/{judged}/cancel").status_code == 409
    assert value(scrape(client), "gate_queued_seconds_count", outcome="cancelled") == 1

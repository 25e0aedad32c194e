"""Retention: backdated rows in the real Postgres, one pass, and exactly what is gone.

Projects `short` (1 day) and `long` (30 days); gates are made through the API, some judged
with the fake sandbox, then their times are moved back with SQL and one pass runs.
"""

from __future__ import annotations

import io
import logging
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gate_service.bundles.archive import read_archive
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.gates import lifecycle
from gate_service.worker.handler import WorkerContext
from gate_service.worker.loop import Worker
from gate_service.worker.retention import (
    UNATTRIBUTED,
    RetentionClock,
    RetentionReport,
    run_retention,
)
from tests.fixtures.auth import as_token, project_token
from tests.fixtures.projects import AGENTS, bundle_of, write
from tests.fixtures.sandbox import FakeSandbox

LOGGER = "gate_service.worker.retention"


def project_bundle(root: Path, marker: str) -> bytes:
    """A one-case project; ``marker`` makes its bytes (and sha256) its own."""
    files = {
        **AGENTS,
        "tests/one.yaml": """
            agent: calc
            tests:
              - name: adds
                payload: '{"a": 1, "b": 2}'
                expected_result: output.sum == 3
        """,
        "tests/files/marker.txt": marker,
    }
    return bundle_of(write(root / marker, files))


def submit(c: TestClient, data: bytes) -> str:
    r = c.post("/v1/gates", files={"bundle": ("b.tgz", data)})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def judge(c: TestClient, data: bytes, settings: Settings, sessions: sessionmaker[Session]) -> str:
    gate_id = submit(c, data)
    quiet = settings.model_copy(update={"retention_interval_seconds": 0})
    ctx = WorkerContext(quiet, sessions, FakeSandbox(), threading.Event())
    assert Worker(ctx, name="w", retention_clock=RetentionClock()).run_once()
    status = c.get(f"/v1/gates/{gate_id}").json()["status"]
    assert status == "passed", status
    return gate_id


def cancelled(c: TestClient, data: bytes) -> str:
    gate_id = submit(c, data)
    r = c.post(f"/v1/gates/{gate_id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
    return gate_id


def backdate(sessions: sessionmaker[Session], gate_ids: list[str], days: int) -> None:
    with session_scope(sessions) as s:
        s.execute(
            text(
                "UPDATE gates SET created_at = now() - make_interval(days => :d), "
                "finished_at = CASE WHEN finished_at IS NULL THEN NULL "
                "ELSE now() - make_interval(days => :d) END WHERE id = ANY(:ids)"
            ),
            {"d": days, "ids": [uuid.UUID(g) for g in gate_ids]},
        )


def scalar(sessions: sessionmaker[Session], sql: str, **params: Any) -> Any:
    with session_scope(sessions) as s:
        return s.execute(text(sql), params).scalar()


def gate_ids(sessions: sessionmaker[Session]) -> set[str]:
    with session_scope(sessions) as s:
        return {str(r[0]) for r in s.execute(text("SELECT id FROM gates"))}


def bundle_of_gate(sessions: sessionmaker[Session], gate_id: str) -> str:
    return str(scalar(sessions, "SELECT bundle_sha256 FROM gates WHERE id = :g", g=gate_id))


def bundles(sessions: sessionmaker[Session]) -> set[str]:
    """The stored bundles, each checked to have its bytes and no bundle's bytes outliving it."""
    with session_scope(sessions) as s:
        rows = {str(r[0]) for r in s.execute(text("SELECT sha256 FROM bundles"))}
        chunked = {str(r[0]) for r in s.execute(text("SELECT DISTINCT sha256 FROM bundle_chunks"))}
    assert chunked == rows
    return rows


def counts_of(sessions: sessionmaker[Session], ids: list[str]) -> dict[str, int]:
    """Cases, runs and jobs that still belong to these gates."""
    keys = [uuid.UUID(g) for g in ids]
    return {
        "cases": scalar(sessions, "SELECT count(*) FROM cases WHERE gate_id = ANY(:k)", k=keys),
        "runs": scalar(
            sessions,
            "SELECT count(*) FROM runs r JOIN cases c ON c.id = r.case_id "
            "WHERE c.gate_id = ANY(:k)",
            k=keys,
        ),
        "jobs": scalar(sessions, "SELECT count(*) FROM jobs WHERE gate_id = ANY(:k)", k=keys),
    }


@pytest.fixture
def projects(client: TestClient) -> dict[str, TestClient]:
    made = {}
    for name, days in (("short", 1), ("long", 30)):
        r = client.post("/v1/projects", json={"name": name, "retention_days": days})
        assert r.status_code == 201, r.text
        made[name] = as_token(client, project_token(client, name, ["submit", "read"]))
    return made


def test_a_pass_deletes_what_is_older_than_its_projects_retention(
    client: TestClient,
    projects: dict[str, TestClient],
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    short, long = projects["short"], projects["long"]
    shared = project_bundle(tmp_path, "shared")
    own = project_bundle(tmp_path, "own")
    # short (1 day): two old judged gates go; an old queued one, an old running one, an old
    # one whose job a live worker still holds, and a new judged one stay.
    old_own = judge(short, own, settings, sessions)
    old_shared = judge(short, shared, settings, sessions)
    new_short = judge(short, project_bundle(tmp_path, "new"), settings, sessions)
    # long (30 days): a 10-day-old judged gate stays, and so does its new gate on the
    # bundle short's old gate also used.
    old_long = judge(long, project_bundle(tmp_path, "long"), settings, sessions)
    new_long_shared = judge(long, shared, settings, sessions)
    old_queued = submit(short, project_bundle(tmp_path, "queued"))
    old_running = cancelled(short, project_bundle(tmp_path, "running"))
    old_leased = cancelled(short, project_bundle(tmp_path, "leased"))
    backdate(sessions, [old_own, old_shared, old_queued, old_running, old_leased, old_long], 10)
    with session_scope(sessions) as s:
        s.execute(
            text("UPDATE gates SET status = 'running', finished_at = NULL WHERE id = :g"),
            {"g": old_running},
        )
        s.execute(
            text(
                "UPDATE jobs SET state = 'running', lease_owner = 'elsewhere', "
                "lease_expires_at = now() + interval '1 hour' WHERE gate_id = :g"
            ),
            {"g": old_leased},
        )
    doomed = [old_own, old_shared]
    before = counts_of(sessions, doomed)
    assert before["cases"] == 2 and before["runs"] == 2 and before["jobs"] == 2
    own_sha, shared_sha = bundle_of_gate(sessions, old_own), bundle_of_gate(sessions, old_shared)
    kept_runs = counts_of(sessions, [new_short, old_long, new_long_shared])
    freed = scalar(
        sessions,
        "SELECT sum(result_bytes) FROM gates WHERE id = ANY(:k)",
        k=[uuid.UUID(g) for g in doomed],
    )
    assert freed > 0  # the runs' stored bytes, which the quota counts

    caplog.set_level(logging.DEBUG, logger=LOGGER)
    report = run_retention(sessions, settings)

    assert gate_ids(sessions) == {
        old_queued,
        old_running,
        old_leased,
        new_short,
        old_long,
        new_long_shared,
    }
    assert counts_of(sessions, doomed) == {"cases": 0, "runs": 0, "jobs": 0}
    assert counts_of(sessions, [new_short, old_long, new_long_shared]) == kept_runs
    assert own_sha not in bundles(sessions)
    assert shared_sha in bundles(sessions)
    assert all(bundle_of_gate(sessions, g) in bundles(sessions) for g in gate_ids(sessions))
    # Through the API, the deleted gate and its runs are gone.
    assert short.get(f"/v1/gates/{old_own}").status_code == 404
    assert long.get(f"/v1/gates/{old_long}").status_code == 200

    got = report.projects["short"]
    assert (got.gates, got.cases, got.runs, got.bundles) == (2, 2, 2, 1)
    assert got.bundle_bytes == len(own)
    assert got.result_bytes == freed
    assert report.projects["long"].empty and report.projects["default"].empty
    assert not report.skipped
    infos = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]
    assert len(infos) == 1
    line = infos[0].getMessage()
    assert (
        f"short: 2 gates ({freed} result bytes freed), 2 cases, 2 runs, 1 bundles "
        f"({len(own)} bytes freed)"
    ) in line
    assert "long:" not in line

    # Nothing left to do: no INFO line, only DEBUG.
    caplog.clear()
    again = run_retention(sessions, settings)
    assert again.total.empty
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.DEBUG]


def test_a_later_now_and_a_shorter_retention_take_more(
    client: TestClient,
    projects: dict[str, TestClient],
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    from datetime import timedelta

    from gate_service.models import utcnow

    long = projects["long"]
    gate = judge(long, project_bundle(tmp_path, "a"), settings, sessions)
    backdate(sessions, [gate], 10)
    assert run_retention(sessions, settings).total.empty
    # Ages are measured from `now`: 25 days later the 10-day-old gate is 35 days old.
    later = run_retention(sessions, settings, now=utcnow() + timedelta(days=25))
    assert later.projects["long"].gates == 1
    assert gate not in gate_ids(sessions)

    other = judge(long, project_bundle(tmp_path, "b"), settings, sessions)
    backdate(sessions, [other], 10)
    assert client.patch("/v1/projects/long", json={"retention_days": 7}).status_code == 200
    assert run_retention(sessions, settings).projects["long"].gates == 1
    assert other not in gate_ids(sessions)


def test_batches_of_two_take_all_five_old_gates_in_one_pass(
    projects: dict[str, TestClient],
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    short = projects["short"]
    old = [cancelled(short, project_bundle(tmp_path, f"g{i}")) for i in range(5)]
    kept = cancelled(short, project_bundle(tmp_path, "kept"))
    backdate(sessions, old, 3)
    report = run_retention(sessions, settings.model_copy(update={"retention_batch_size": 2}))
    assert (report.projects["short"].gates, report.projects["short"].bundles) == (5, 5)
    assert gate_ids(sessions) == {kept}
    assert bundles(sessions) == {bundle_of_gate(sessions, kept)}


def test_audit_events_follow_their_projects_retention(
    client: TestClient,
    projects: dict[str, TestClient],
    settings: Settings,
    sessions: sessionmaker[Session],
) -> None:
    assert as_token(client, "gate_unknown").get("/v1/gates").status_code == 401
    with session_scope(sessions) as s:
        s.execute(text("UPDATE audit_events SET at = now() - interval '10 days'"))
    summary = {(name, action): n for name, action, n in _audit_summary(sessions)}
    assert summary[("short", "token.created")] == 1
    assert summary[(None, "token.rejected")] == 1

    report = run_retention(sessions, settings)
    after = {(name, action) for name, action, _ in _audit_summary(sessions)}
    # short keeps 1 day: its events go; long and default keep 30 days; an event of no
    # project follows default's retention.
    assert ("short", "token.created") not in after
    assert ("long", "token.created") in after
    assert (None, "token.rejected") in after
    assert report.projects["short"].audit_events == 1

    assert client.patch("/v1/projects/default", json={"retention_days": 5}).status_code == 200
    report = run_retention(sessions, settings)
    after = {(name, action) for name, action, _ in _audit_summary(sessions)}
    assert (None, "token.rejected") not in after
    assert ("default", "project.created") not in after  # 10 days old, default now keeps 5
    assert ("default", "project.updated") in after  # the change itself is new
    # project.created twice, and the unknown token
    assert report.projects["default"].audit_events == 3


def _audit_summary(sessions: sessionmaker[Session]) -> list[tuple[str | None, str, int]]:
    with session_scope(sessions) as s:
        rows = s.execute(
            text(
                "SELECT p.name, e.action, count(*) FROM audit_events e "
                "LEFT JOIN projects p ON p.id = e.project_id GROUP BY p.name, e.action"
            )
        ).all()
    return [(r[0], r[1], int(r[2])) for r in rows]


@pytest.mark.parametrize("exclusive", [True, False])
def test_two_concurrent_passes_neither_fail_nor_double_count(
    projects: dict[str, TestClient],
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    exclusive: bool,
) -> None:
    short = projects["short"]
    shared = project_bundle(tmp_path, "shared")
    old = [cancelled(short, shared) for _ in range(4)]
    old += [cancelled(short, project_bundle(tmp_path, f"g{i}")) for i in range(4)]
    backdate(sessions, old, 3)
    tight = settings.model_copy(update={"retention_batch_size": 1})
    start = threading.Barrier(2)
    reports: list[RetentionReport] = []
    errors: list[BaseException] = []

    def one_pass() -> None:
        try:
            start.wait(timeout=30)
            reports.append(run_retention(sessions, tight, exclusive=exclusive))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and len(reports) == 2
    total_gates = sum(r.total.gates for r in reports)
    total_bundles = sum(r.total.bundles for r in reports)
    if total_gates < 8 or total_bundles < 5:
        # A pass that found every row locked by the other one stopped early: one more pass
        # picks up whatever it left, and nothing may be counted twice.
        last = run_retention(sessions, tight)
        total_gates += last.total.gates
        total_bundles += last.total.bundles
    assert (total_gates, total_bundles) == (8, 5)
    assert gate_ids(sessions) == set() and bundles(sessions) == set()
    if exclusive:
        assert any(not r.skipped for r in reports)


def test_a_bundle_of_an_upload_in_flight_is_kept(
    projects: dict[str, TestClient],
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    short, long = projects["short"], projects["long"]
    data = project_bundle(tmp_path, "again")
    old = cancelled(short, data)
    backdate(sessions, [old], 3)
    sha = bundle_of_gate(sessions, old)
    long_id = scalar(sessions, "SELECT id FROM projects WHERE name = 'long'")
    # An upload of the same bytes to another project is in flight (not committed yet) while
    # a pass deletes the only gate that referenced them.
    upload = sessions()
    try:
        gate, created = lifecycle.create_gate(
            upload,
            settings,
            project_id=long_id,
            project_name="long",
            sha256=sha,
            bundle=io.BytesIO(data),
            size_bytes=len(data),
            manifest=read_archive(data),
            name_filter=None,
            labels={},
            idempotency_key=None,
        )
        report = run_retention(sessions, settings)
        assert report.projects["short"].gates == 1 and report.total.bundles == 0
        upload.commit()
    finally:
        upload.close()
    assert created and sha in bundles(sessions)
    assert long.get(f"/v1/gates/{gate.id}").json()["bundle"]["sha256"] == sha


def test_an_unreferenced_bundle_left_by_an_earlier_pass_is_deleted(
    projects: dict[str, TestClient],
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    gate = cancelled(projects["short"], project_bundle(tmp_path, "orphan"))
    sha = bundle_of_gate(sessions, gate)
    with session_scope(sessions) as s:  # as if a pass stopped after its gate batches
        s.execute(text("DELETE FROM gates WHERE id = :g"), {"g": gate})
    report = run_retention(sessions, settings)
    assert report.projects[UNATTRIBUTED].bundles == 1
    assert sha not in bundles(sessions)


def test_the_worker_runs_a_pass_at_most_once_per_interval_per_process(
    projects: dict[str, TestClient],
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    short = projects["short"]
    first = cancelled(short, project_bundle(tmp_path, "first"))
    backdate(sessions, [first], 3)
    clock = RetentionClock()  # one per process; both workers below share it
    ctx = WorkerContext(settings, sessions, FakeSandbox(), threading.Event())
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert not Worker(ctx, name="a", retention_clock=clock).run_once()  # queue empty
    assert first not in gate_ids(sessions)
    assert any("short: 1 gates" in r.getMessage() for r in caplog.records if r.name == LOGGER)

    second = cancelled(short, project_bundle(tmp_path, "second"))
    backdate(sessions, [second], 3)
    assert not Worker(ctx, name="b", retention_clock=clock).run_once()
    assert second in gate_ids(sessions)  # within the interval: no second pass

    off = settings.model_copy(update={"retention_interval_seconds": 0})
    idle = WorkerContext(off, sessions, FakeSandbox(), threading.Event())
    assert not Worker(idle, name="c", retention_clock=RetentionClock()).run_once()
    assert second in gate_ids(sessions)  # 0 turns the job off

"""Admission control on a real Postgres: every cap answers at once, with its count and limit."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from gate_service import jobs
from gate_service.admission import Slots
from gate_service.app_state import state_of
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.main import create_app
from gate_service.models import Case, Job
from gate_service.sandbox import ModelChannel, RunLimits, RunResult
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN, as_token, bearer, project_token
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.sandbox import FakeSandbox, fake_worker


@contextmanager
def serving(settings: Settings, **caps: Any) -> Iterator[TestClient]:
    """An app with these caps, its client holding the bootstrap admin token."""
    with TestClient(
        create_app(settings.model_copy(update=caps)), headers=bearer(ADMIN_TOKEN)
    ) as client:
        yield client


def tenant(admin: TestClient, name: str) -> TestClient:
    return as_token(admin, project_token(admin, name, ["submit", "read"]))


def post(c: TestClient, data: bytes, **kw: Any) -> Any:
    return c.post("/v1/gates", files={"bundle": ("b.tgz", data)}, **kw)


@pytest.fixture
def bundles(tmp_path: Path) -> tuple[bytes, bytes]:
    return (
        bundle_of(calculator_project(tmp_path / "a", failing=False)),
        bundle_of(calculator_project(tmp_path / "b", failing=True)),
    )


def worker_for(
    settings: Settings, sessions: sessionmaker[Session], sandbox: FakeSandbox, **caps: Any
) -> Worker:
    return fake_worker(settings.model_copy(update=caps), sessions, sandbox)


# -- per project at submission ----------------------------------------------------------------


def test_a_project_over_its_queued_cap_gets_429_with_retry_after_others_do_not(
    settings: Settings, bundles: tuple[bytes, bytes], sessions: sessionmaker[Session]
) -> None:
    data, _ = bundles
    with serving(settings, max_queued_gates_per_project=2) as admin:
        alpha, beta = tenant(admin, "alpha"), tenant(admin, "beta")
        first = post(alpha, data, headers={"Idempotency-Key": "k1"})
        assert first.status_code == 202
        assert post(alpha, data).status_code == 202
        refused = post(alpha, data)
        assert refused.status_code == 429, refused.text
        body = refused.json()
        assert body["error"] == "TooManyRequests"
        assert "already has 2 gates waiting" in body["detail"]
        assert "the limit is 2" in body["detail"]
        assert int(refused.headers["Retry-After"]) > 0
        # Nothing was stored for the refused upload.
        with sessions() as s:
            assert s.scalar(text("SELECT count(*) FROM gates")) == 2
        # A repeated idempotency key still finds its gate while the project is full.
        again = post(alpha, data, headers={"Idempotency-Key": "k1"})
        assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
        # Another project has its own cap.
        assert post(beta, data).status_code == 202
        # Once a worker takes one of alpha's gates, alpha has room again.
        with session_scope(sessions) as s:
            assert jobs.claim(s, owner="w", lease_seconds=60) is not None
        assert post(alpha, data).status_code == 202


def test_concurrent_submissions_never_pass_the_project_cap(
    settings: Settings, bundles: tuple[bytes, bytes], sessions: sessionmaker[Session]
) -> None:
    """The project row lock makes the count exact: 8 at once against a cap of 3 → 3 in."""
    data, _ = bundles
    caps = {"max_queued_gates_per_project": 3, "max_concurrent_uploads": 50}
    codes: list[int] = []
    barrier = threading.Barrier(8, timeout=60)
    with serving(settings, **caps) as admin:
        # Eight clients of the one app; each request runs on its own event loop thread.
        clients = [tenant(admin, "alpha") for _ in range(8)]

        def submit(c: TestClient) -> None:
            barrier.wait()
            codes.append(post(c, data).status_code)

        threads = [threading.Thread(target=submit, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(codes) == [202] * 3 + [429] * 5
    with sessions() as s:
        assert s.scalar(text("SELECT count(*) FROM jobs WHERE state = 'queued'")) == 3


def test_stored_bundle_bytes_are_capped_per_project_without_retry_after(
    settings: Settings, bundles: tuple[bytes, bytes]
) -> None:
    small, other = bundles
    cap = len(small) + len(other) - 1  # room for one of the two, not both
    with serving(settings, max_bundle_bytes_per_project=cap) as admin:
        alpha, beta = tenant(admin, "alpha"), tenant(admin, "beta")
        assert post(alpha, small).status_code == 202
        # The same bundle again is already stored: it costs nothing.
        assert post(alpha, small).status_code == 202
        refused = post(alpha, other)
        assert refused.status_code == 429, refused.text
        detail = refused.json()["detail"]
        assert f"stores {len(small)} bytes" in detail
        assert f"this one's {len(other)} bytes" in detail
        assert f"the limit of {cap} bytes" in detail
        assert "Retention frees space" in detail
        assert "Retry-After" not in refused.headers
        # Bytes are charged per project: beta has stored nothing yet.
        assert post(beta, other).status_code == 202


# -- the whole service ------------------------------------------------------------------------


def test_the_global_queue_cap_answers_503_with_retry_after(
    settings: Settings, bundles: tuple[bytes, bytes]
) -> None:
    data, _ = bundles
    with serving(settings, max_queued_gates=2) as admin:
        alpha, beta = tenant(admin, "alpha"), tenant(admin, "beta")
        assert post(alpha, data).status_code == 202
        assert post(beta, data).status_code == 202
        refused = post(alpha, data)
        assert refused.status_code == 503, refused.text
        body = refused.json()
        assert body["error"] == "ServiceUnavailable"
        assert "already has 2 gates waiting" in body["detail"]
        assert "the limit is 2" in body["detail"]
        assert int(refused.headers["Retry-After"]) > 0


# -- running gates per project (the worker's claim) ------------------------------------------


def project_of(sessions: sessionmaker[Session], gate_id: uuid.UUID) -> str:
    with sessions() as s:
        return str(
            s.execute(
                text("SELECT p.name FROM gates g JOIN projects p ON p.id = g.project_id "
                     "WHERE g.id = :g"),
                {"g": gate_id},
            ).scalar_one()
        )  # fmt: skip


def test_a_claim_skips_a_project_at_its_running_cap(
    client: TestClient, bundles: tuple[bytes, bytes], sessions: sessionmaker[Session]
) -> None:
    data, _ = bundles
    alpha, beta = tenant(client, "alpha"), tenant(client, "beta")
    alpha_gates = [post(alpha, data).json()["id"] for _ in range(3)]
    beta_gate = post(beta, data).json()["id"]  # queued after all of alpha's

    def claim() -> jobs.ClaimedJob | None:
        with session_scope(sessions) as s:
            return jobs.claim(s, owner="w", lease_seconds=60, max_running_per_project=2)

    first, second, third = claim(), claim(), claim()
    assert first and second and third
    # Round-robin across projects (see test_fair_scheduling.py): alpha, beta, alpha.
    claimed = [str(first.gate_id), str(second.gate_id), str(third.gate_id)]
    assert claimed == [alpha_gates[0], beta_gate, alpha_gates[1]]
    assert claim() is None  # only alpha's third is queued, and alpha has 2 running
    with session_scope(sessions) as s:
        first.finish(s)
    fourth = claim()
    assert fourth is not None and str(fourth.gate_id) == alpha_gates[2]


def test_concurrent_claims_never_pass_the_running_cap(
    client: TestClient, bundles: tuple[bytes, bytes], sessions: sessionmaker[Session]
) -> None:
    data, _ = bundles
    alpha, beta = tenant(client, "alpha"), tenant(client, "beta")
    for _ in range(6):
        assert post(alpha, data).status_code == 202
    for _ in range(2):
        assert post(beta, data).status_code == 202
    claimed: list[uuid.UUID] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8, timeout=60)

    def claimer(name: str) -> None:
        barrier.wait()
        with session_scope(sessions) as s:
            job = jobs.claim(s, owner=name, lease_seconds=60, max_running_per_project=2)
        if job is not None:
            with lock:
                claimed.append(job.gate_id)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    projects = sorted(project_of(sessions, g) for g in claimed)
    assert projects == ["alpha", "alpha", "beta", "beta"]
    with sessions() as s:
        assert s.scalar(text("SELECT count(*) FROM jobs WHERE state = 'running'")) == 4


def test_the_worker_loop_claims_under_the_running_cap(
    client: TestClient,
    settings: Settings,
    bundles: tuple[bytes, bytes],
    sessions: sessionmaker[Session],
) -> None:
    data, _ = bundles
    gate_id = post(client, data).json()["id"]
    with session_scope(sessions) as s:  # another worker is judging one of default's gates
        assert jobs.claim(s, owner="other", lease_seconds=60) is not None
    worker = worker_for(settings, sessions, FakeSandbox(), max_running_gates_per_project=1)
    second = post(client, data).json()["id"]
    assert gate_id != second
    assert worker.run_once() is False  # default is at its cap: nothing to take
    assert client.get(f"/v1/gates/{second}").json()["status"] == "queued"


# -- per gate in the worker: cases --------------------------------------------------------------


def test_a_gate_over_the_case_cap_ends_error_in_validating_with_the_count(
    client: TestClient,
    settings: Settings,
    bundles: tuple[bytes, bytes],
    sessions: sessionmaker[Session],
) -> None:
    data, _ = bundles  # four cases
    sandbox = FakeSandbox()
    worker = worker_for(settings, sessions, sandbox, max_cases_per_gate=3)
    over = post(client, data).json()["id"]
    worker.run_once()
    gate = client.get(f"/v1/gates/{over}").json()
    assert (gate["status"], gate["phase"]) == ("error", "validating")
    assert "selects 4 cases; the limit is 3 per gate" in gate["failure_reason"]
    assert gate["problems"][0]["cases"] == 4 and gate["problems"][0]["limit"] == 3
    assert sandbox.images == {} and sandbox.runs == []
    # A filter that selects fewer cases brings the same bundle under the cap.
    under = client.post(
        "/v1/gates", files={"bundle": ("b.tgz", data)}, data={"filter": "adds"}
    ).json()["id"]
    worker.run_once()
    assert client.get(f"/v1/gates/{under}").json()["status"] == "passed"


# -- per gate in the worker: the deadline ------------------------------------------------------


def backdate(sessions: sessionmaker[Session], gate_id: str, seconds: float) -> None:
    """Make the gate look started ``seconds`` ago (no sleeping, no wall clock)."""
    with session_scope(sessions) as s:
        s.execute(
            text("UPDATE gates SET started_at = now() - make_interval(secs => :s) WHERE id = :g"),
            {"s": seconds, "g": gate_id},
        )


class RecordingSandbox(FakeSandbox):
    """Records each case's limits; optionally runs a hook after each case."""

    def __init__(self) -> None:
        super().__init__()
        self.limits: list[RunLimits] = []
        self.after_run: Callable[[], None] | None = None
        self.time_out = False

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Any,
        stdin: bytes = b"",
        halt: threading.Event | None = None,
        model_channel: ModelChannel | None = None,
    ) -> RunResult:
        self.limits.append(limits)
        result = super().run(
            image,
            argv,
            limits=limits,
            labels=labels,
            stdin=stdin,
            halt=halt,
            model_channel=model_channel,
        )
        if self.after_run is not None:
            self.after_run()
        if self.time_out:  # as a container killed at its wall limit
            return RunResult(
                exit_code=None,
                stdout=b"",
                stderr=b"",
                duration_ms=int(limits.wall_seconds * 1000),
                timed_out=True,
                oom_killed=False,
                output_truncated=False,
            )
        return result


def cases_of(sessions: sessionmaker[Session], gate_id: str) -> list[tuple[str, str | None]]:
    with sessions() as s:
        return [
            (c.status, c.failure_reason)
            for c in s.scalars(
                select(Case).where(Case.gate_id == uuid.UUID(gate_id)).order_by(Case.position)
            )
        ]


def test_a_gate_started_past_its_deadline_ends_error_before_anything_runs(
    client: TestClient,
    settings: Settings,
    bundles: tuple[bytes, bytes],
    sessions: sessionmaker[Session],
) -> None:
    data, _ = bundles
    sandbox = RecordingSandbox()
    worker = worker_for(settings, sessions, sandbox, gate_deadline_seconds=3600)
    gate_id = post(client, data).json()["id"]
    backdate(sessions, gate_id, 3600 + 5)  # e.g. a retry after earlier attempts used it up
    worker.run_once()
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert gate["status"] == "error"
    assert gate["failure_reason"].startswith("the gate ran past its deadline of 3600 s")
    assert sandbox.runs == [] and sandbox.images == {}
    with sessions() as s:
        assert s.scalar(select(Job.state)) == "done"


def test_a_gate_that_passes_its_deadline_between_cases_stops_there(
    client: TestClient,
    settings: Settings,
    bundles: tuple[bytes, bytes],
    sessions: sessionmaker[Session],
) -> None:
    data, _ = bundles
    sandbox = RecordingSandbox()
    worker = worker_for(settings, sessions, sandbox, gate_deadline_seconds=3600, case_concurrency=1)
    gate_id = post(client, data).json()["id"]
    # The first case "takes" the rest of the hour.
    sandbox.after_run = lambda: backdate(sessions, gate_id, 3600 + 5)
    worker.run_once()
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert (gate["status"], gate["phase"]) == ("error", "running_tests")
    assert gate["failure_reason"].startswith("the gate ran past its deadline of 3600 s")
    assert len(sandbox.runs) == 1  # no case started after the deadline
    cases = cases_of(sessions, gate_id)
    assert cases[0][0] == "passed"  # judged in time, and kept
    assert cases[1:] == [("cancelled", "not run: the gate ran past its deadline")] * 3
    with sessions() as s:
        assert s.scalar(select(Job.state)) == "done"  # not retried


def test_no_case_container_gets_longer_than_the_time_left(
    client: TestClient,
    settings: Settings,
    bundles: tuple[bytes, bytes],
    sessions: sessionmaker[Session],
) -> None:
    data, _ = bundles
    sandbox = RecordingSandbox()
    worker = worker_for(settings, sessions, sandbox, gate_deadline_seconds=3600)
    free = post(client, data).json()["id"]
    worker.run_once()
    natural = min(limit.wall_seconds for limit in sandbox.limits)
    assert natural > 30  # without the deadline, every case gets more than 30 s
    assert client.get(f"/v1/gates/{free}").json()["status"] == "passed"

    sandbox.limits.clear()
    tight = post(client, data).json()["id"]
    backdate(sessions, tight, 3600 - 30)  # 30 s left
    worker.run_once()
    assert sandbox.limits and all(0 < limit.wall_seconds <= 30 for limit in sandbox.limits)
    assert client.get(f"/v1/gates/{tight}").json()["status"] == "passed"


def test_a_case_stopped_at_the_deadline_ends_the_gate_error(
    client: TestClient,
    settings: Settings,
    bundles: tuple[bytes, bytes],
    sessions: sessionmaker[Session],
) -> None:
    data, _ = bundles
    sandbox = RecordingSandbox()
    sandbox.time_out = True
    worker = worker_for(settings, sessions, sandbox, gate_deadline_seconds=3600, case_concurrency=1)
    gate_id = post(client, data).json()["id"]
    backdate(sessions, gate_id, 3600 - 30)
    worker.run_once()
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert gate["status"] == "error"
    assert gate["failure_reason"].startswith("the gate ran past its deadline of 3600 s")
    assert len(sandbox.runs) == 1
    cases = cases_of(sessions, gate_id)
    assert cases[0] == (
        "error",
        "the gate reached its deadline of 3600 s while this case ran; its container was stopped",
    )
    assert {status for status, _ in cases[1:]} == {"cancelled"}


# -- per API process: uploads and long-polls ---------------------------------------------------


def hold_all(slots: Slots) -> list[object]:
    """Take every slot, each for a project of its own (a project holds at most its share);
    the projects that hold them."""
    held: list[object] = []
    while slots.try_acquire(project := object()):
        held.append(project)
    return held


def test_uploads_over_the_process_cap_get_503_at_once(
    settings: Settings, bundles: tuple[bytes, bytes], sessions: sessionmaker[Session]
) -> None:
    data, _ = bundles
    with serving(settings, max_concurrent_uploads=3) as c:
        slots: Slots = state_of(c.app).upload_slots
        holders = hold_all(slots)
        assert len(holders) == 3  # three uploads in progress
        refused = post(c, data)
        assert refused.status_code == 503, refused.text
        body = refused.json()
        assert body["error"] == "ServiceUnavailable"
        assert "already handling 3 uploads" in body["detail"]
        assert "GATE_MAX_CONCURRENT_UPLOADS" in body["detail"]
        assert int(refused.headers["Retry-After"]) > 0
        with sessions() as s:
            assert s.scalar(text("SELECT count(*) FROM gates")) == 0
        slots.release(holders[0])  # one upload finished
        assert post(c, data).status_code == 202
        assert slots.in_use == 2  # the accepted upload gave its slot back


def test_each_app_has_its_own_slots(settings: Settings) -> None:
    one = create_app(settings.model_copy(update={"max_concurrent_uploads": 4}))
    two = create_app(settings.model_copy(update={"max_concurrent_uploads": 4}))
    with TestClient(one), TestClient(two):  # each lifespan builds its app's state
        assert state_of(one).upload_slots is not state_of(two).upload_slots
        assert len(hold_all(state_of(one).upload_slots)) == 4
        assert state_of(two).upload_slots.in_use == 0


def test_long_polls_over_the_process_cap_get_503_plain_reads_do_not(
    settings: Settings, bundles: tuple[bytes, bytes]
) -> None:
    data, _ = bundles
    with serving(settings, max_concurrent_long_polls=2) as c:
        gate_id = post(c, data).json()["id"]
        slots: Slots = state_of(c.app).long_poll_slots
        first = c.get(f"/v1/gates/{gate_id}?wait=1")  # changed since nothing: answers at once
        assert first.status_code == 200
        assert slots.in_use == 0  # given back
        assert len(hold_all(slots)) == 2
        refused = c.get(f"/v1/gates/{gate_id}?wait=30")
        assert refused.status_code == 503, refused.text
        assert "already handling 2 long-polls" in refused.json()["detail"]
        assert int(refused.headers["Retry-After"]) > 0
        assert c.get(f"/v1/gates/{gate_id}").status_code == 200  # no wait: never counted
        assert c.get(f"/v1/gates/{gate_id}?wait=0").status_code == 200

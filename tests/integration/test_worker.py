"""The worker's queue and stages on a real Postgres, with the in-process fake sandbox."""

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gate_service import jobs
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.models import Case, Gate, Job, Run
from gate_service.sandbox import BUILD_DEADLINE_LABEL, BUILD_STAGE, LABEL
from gate_service.worker import handler
from gate_service.worker.handler import WorkerContext, judge_gate
from gate_service.worker.loop import Worker
from tests.fixtures.projects import (
    bundle_of,
    calculator_project,
    requirements_project,
    unknown_agent_project,
)
from tests.fixtures.sandbox import FakeSandbox, fake_wheels, fake_worker
from tests.fixtures.waiting import wait_until


def submit(client: TestClient, data: bytes) -> str:
    response = client.post("/v1/gates", files={"bundle": ("b.tgz", data)})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_worker_judges_a_gate_to_failed_with_cases_and_runs(
    client: TestClient, worker: Worker, tmp_path: Path, sandbox: FakeSandbox
) -> None:
    gate_id = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=True)))
    assert worker.run_once() is True
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert (gate["status"], gate["phase"]) == ("failed", "done")
    by_name = {c["test_name"]: c for c in gate["cases"]}
    assert gate["total_cases"] == len(by_name) == 6
    assert len(sandbox.runs) == 6  # one sandbox run per case
    wrong = by_name["expects_the_wrong_sum"]
    assert (wrong["passed"], wrong["successes"], wrong["runs"]) == (False, 0, 2)
    assert "output.sum = 4" in wrong["failure_reason"]
    # Early stop (GATE_EARLY_STOP, on): at 100% its first failed run decided the case, so
    # its second never started; a passing case at 100% runs every invocation.
    assert wrong["agent_run_passed"] == [False]
    assert (wrong["invocations_run"], wrong["stopped_early"]) == (1, True)
    adds = by_name["adds_two_numbers"]
    assert (adds["invocations_run"], adds["stopped_early"]) == (2, False)
    assert by_name["adds_two_numbers"]["passed"] is True
    assert "calc::expects_the_wrong_sum" in gate["failure_reason"]
    run = client.get(f"/v1/runs/{wrong['agent_run_ids'][0]}").json()
    assert run["output"] == {"sum": 4}
    assert any(s["type"] == "tool_call" for s in run["traces"])
    assert gate["failed_cases"] == 2 and gate["passed_cases"] == 4
    assert worker.run_once() is False  # the queue is empty now


def test_unknown_agent_ends_error_in_validating_naming_suite_and_agent(
    client: TestClient, worker: Worker, tmp_path: Path, sandbox: FakeSandbox
) -> None:
    gate_id = submit(client, bundle_of(unknown_agent_project(tmp_path / "p")))
    worker.run_once()
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert (gate["status"], gate["phase"]) == ("error", "validating")
    assert "tests/ghost.yaml" in gate["failure_reason"] and "'ghost'" in gate["failure_reason"]
    assert gate["problems"][0]["case"] == "talks_to_nobody"
    assert sandbox.images == {}  # no image was built


def test_filter_runs_only_matching_cases(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=True))
    response = client.post("/v1/gates", files={"bundle": ("b.tgz", data)}, data={"filter": "adds"})
    worker.run_once()
    gate = client.get(f"/v1/gates/{response.json()['id']}").json()
    assert gate["status"] == "passed"
    assert sorted(c["test_name"] for c in gate["cases"]) == [
        "adds_then_doubles",
        "adds_two_numbers",
    ]


def test_skip_locked_gives_each_job_to_one_claimer(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    ids = {submit(client, data) for _ in range(4)}
    claimed: list[uuid.UUID] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        while True:
            with session_scope(sessions) as s:
                job = jobs.claim(s, owner=name, lease_seconds=60)
            if job is None:
                return
            with lock:
                claimed.append(job.gate_id)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(str(g) for g in claimed) == sorted(ids)


def expire_leases(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as s:
        s.execute(text("UPDATE jobs SET lease_expires_at = now() - interval '1 second'"))


def test_expired_lease_is_requeued_then_given_up(
    client: TestClient, worker: Worker, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    for attempt in (1, 2):  # settings.job_max_attempts == 2
        with session_scope(sessions) as s:
            job = jobs.claim(s, owner=f"doomed-{attempt}", lease_seconds=60)
        assert job is not None and job.attempts == attempt
        expire_leases(sessions)
        worker.reap_expired()
    with sessions() as s:
        state = s.scalar(select(Job.state))
    assert state == "done"
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert gate["status"] == "error"
    assert "no worker finished the gate in 2 attempt(s)" in gate["failure_reason"]
    assert "doomed-2" in gate["failure_reason"]


def test_a_worker_that_lost_its_lease_writes_nothing(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    with session_scope(sessions) as s:
        stale = jobs.claim(s, owner="stale", lease_seconds=60)
    assert stale is not None
    expire_leases(sessions)
    with session_scope(sessions) as s:
        for expired in jobs.take_expired(s):
            jobs.requeue_expired(s, expired.id, note="test")
        fresh = jobs.claim(s, owner="fresh", lease_seconds=60)
    assert fresh is not None
    ctx = WorkerContext(
        settings=settings, sessions=sessions, sandbox=FakeSandbox(), stop=threading.Event()
    )
    judge_gate(ctx, stale)  # must notice the lost lease and stop
    with sessions() as s:
        gate = s.get_one(Gate, uuid.UUID(gate_id))
        assert gate.status == "queued"
        assert s.scalar(select(Job.lease_owner)) == "fresh"
    judge_gate(ctx, fresh)
    with sessions() as s:
        assert s.get_one(Gate, uuid.UUID(gate_id)).status == "passed"


def test_infrastructure_errors_are_retried_then_reported(
    client: TestClient,
    worker: Worker,
    sandbox: FakeSandbox,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    gate_id = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    sandbox.fail_runs_with = "engine went away"
    worker.run_once()
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert gate["status"] == "running"  # handed back for another attempt
    with sessions() as s:
        job = s.scalars(select(Job)).one()
        assert (job.state, job.attempts) == ("queued", 1)
        assert (job.last_error or "").startswith("engine went away (reference ")
    worker.run_once()
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert gate["status"] == "error"
    assert gate["failure_reason"].startswith(
        "infrastructure error after 2 attempt(s): engine went away (reference "
    )


def test_a_retry_keeps_cases_already_judged(
    client: TestClient,
    worker: Worker,
    sandbox: FakeSandbox,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    gate_id = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    worker.run_once()
    first_runs = len(sandbox.runs)
    with session_scope(sessions) as s:
        # Pretend the worker died after two cases: reopen the others and requeue the job.
        cases = s.scalars(select(Case).order_by(Case.position)).all()
        for case in cases[2:]:
            case.status = "queued"
            s.query(Run).filter(Run.case_id == case.id).delete()
        s.execute(text("UPDATE gates SET status = 'running'"))
        s.execute(text("UPDATE jobs SET state = 'queued'"))
    worker.run_once()
    assert len(sandbox.runs) == first_runs + len(cases) - 2
    assert client.get(f"/v1/gates/{gate_id}").json()["status"] == "passed"


def test_a_worker_shutting_down_hands_the_job_back_without_using_an_attempt(
    client: TestClient, worker: Worker, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    worker.ctx.stop.set()  # as SIGTERM does: no new case starts
    worker.run_once()
    with sessions() as s:
        job = s.scalars(select(Job)).one()
        assert (job.state, job.attempts, job.lease_owner) == ("queued", 0, None)
        assert job.last_error == "the worker shut down during the job"
    worker.ctx.stop.clear()
    worker.run_once()
    assert client.get(f"/v1/gates/{gate_id}").json()["status"] == "passed"


def test_a_failed_claim_beside_a_held_job_does_not_end_the_call_before_the_job(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    sandbox: FakeSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The database failing a claim made while a job is held (a Postgres restart did so in
    CI): the call goes on until the held job ends, instead of raising beside its thread."""
    worker = fake_worker(
        settings.model_copy(update={"worker_poll_seconds": 0.05}), sessions, sandbox
    )
    gate_id = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    release, claim_failed = threading.Event(), threading.Event()
    run = sandbox.run

    def held_run(*args: Any, **kwargs: Any) -> Any:
        assert release.wait(60), "the test never released the case"
        return run(*args, **kwargs)

    def failing_claim(*_: Any) -> None:
        claim_failed.set()
        raise OperationalError("SELECT", {}, Exception("the database system is shutting down"))

    monkeypatch.setattr(sandbox, "run", held_run)
    monkeypatch.setattr(worker, "_claim_fairly", failing_claim)
    errors: list[BaseException] = []

    def run_once() -> None:
        try:
            worker.run_once()
        except BaseException as exc:
            errors.append(exc)

    caller = threading.Thread(target=run_once, daemon=True)
    caller.start()
    assert claim_failed.wait(60)
    caller.join(0.5)
    still_holding = caller.is_alive()
    release.set()
    caller.join(60)
    assert still_holding and not caller.is_alive() and errors == []
    assert client.get(f"/v1/gates/{gate_id}").json()["status"] == "passed"


def test_the_orphan_reaper_removes_only_this_databases_dead_workers_containers(
    client: TestClient, worker: Worker, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    ours = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    dead = {"gate.gate_id": ours, "gate.owner": "crashed-worker"}
    # Another installation on the same engine: its gate is not in this database.
    theirs = {"gate.gate_id": str(uuid.uuid4()), "gate.owner": "their-worker"}
    unlabelled = {"gate.owner": "someone"}
    sandbox.containers = [dead, theirs, unlabelled]
    worker.reap_orphans()
    assert sandbox.containers == [theirs, unlabelled]


def test_the_orphan_reaper_removes_a_build_step_only_past_its_deadline(
    worker: Worker, sandbox: FakeSandbox
) -> None:
    """A one-stage build's step container whose worker died during the build: removed once
    the deadline on its label has passed, never before; the classic builder's step
    containers (labelled by the LABEL instruction, with no deadline) are the engine's."""
    step = {LABEL: BUILD_STAGE, "gate.build": "b1"}
    stale = {**step, BUILD_DEADLINE_LABEL: str(int(time.time()) - 1)}
    live = {**step, BUILD_DEADLINE_LABEL: str(int(time.time()) + 600)}
    classic = dict(step)
    garbled = {**step, BUILD_DEADLINE_LABEL: "soon"}
    sandbox.containers = [stale, live, classic, garbled]
    worker.reap_orphans()
    assert sandbox.containers == [live, classic, garbled]


def test_model_mode_and_named_variables_reach_the_case_container(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    sandbox: FakeSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-worker")
    monkeypatch.setenv("GATE_SECRET_THING", "never")
    monkeypatch.setenv("UNLISTED", "never")
    worker = Worker(
        WorkerContext(
            settings=settings.model_copy(update={"case_env": "OPENAI_API_KEY, GATE_SECRET_THING"}),
            sessions=sessions,
            sandbox=sandbox,
            stop=threading.Event(),
        )
    )
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    response = client.post(
        "/v1/gates", files={"bundle": ("b.tgz", data)}, data={"model_mode": "replay"}
    )
    assert response.json()["model_mode"] == "replay"
    worker.run_once()
    # Handed to the runner on its stdin (never the container's environment): the named
    # variable only, and the model mode on its command line.
    assert sandbox.envs
    assert all(env == {"OPENAI_API_KEY": "sk-from-the-worker"} for env in sandbox.envs)
    assert all("--model-mode=replay" in argv for argv in sandbox.runs)
    # A fresh, unguessable nonce per case container.
    nonces = sandbox.nonces
    assert len(nonces) == len(sandbox.runs)
    assert len(set(nonces)) == len(nonces) and all(len(n) == 64 for n in nonces)


def test_an_unknown_model_mode_is_a_400(client: TestClient, tmp_path: Path) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    response = client.post(
        "/v1/gates", files={"bundle": ("b.tgz", data)}, data={"model_mode": "yolo"}
    )
    assert response.status_code == 400
    assert "scripted, replay, live" in response.json()["detail"]


def test_a_bad_requirements_file_ends_error_in_validating_before_any_download(
    client: TestClient, worker: Worker, tmp_path: Path, sandbox: FakeSandbox
) -> None:
    reqs = "\ufeff--no-binary=:all:\ngate-e2e-demo==1.0\nx @ https://example.invalid/x.whl\n"
    gate_id = submit(client, bundle_of(requirements_project(tmp_path / "p", reqs)))
    worker.run_once()
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert (gate["status"], gate["phase"]) == ("error", "validating")
    assert "requirements.txt line 1" in gate["failure_reason"]
    assert "byte order mark" in gate["failure_reason"]
    assert [(p["file"], p["line"]) for p in gate["problems"]] == [
        ("requirements.txt", 1),
        ("requirements.txt", 3),
    ]
    assert "URL" in gate["problems"][1]["message"]
    assert sandbox.downloads == []  # nothing was fetched
    assert sandbox.images == {}  # nor built


def test_parsed_requirements_not_the_file_are_what_is_downloaded(
    client: TestClient, worker: Worker, tmp_path: Path, sandbox: FakeSandbox
) -> None:
    reqs = "# deps\ngate-e2e-demo == 1.0  # pinned\n\nattrs>=22; python_version >= '3.8'\n"
    submit(client, bundle_of(requirements_project(tmp_path / "p", reqs)))
    worker.run_once()
    assert sandbox.downloads == [["gate-e2e-demo==1.0", 'attrs>=22; python_version >= "3.8"']]


def test_the_periodic_reaper_removes_containers_no_live_lease_covers(
    client: TestClient,
    worker: Worker,
    sandbox: FakeSandbox,
    sessions: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    finished, expired, live = (submit(client, data) for _ in range(3))
    with session_scope(sessions) as s:
        s.execute(text("UPDATE jobs SET state = 'done' WHERE gate_id = :g"), {"g": finished})
        for gate_id, lease in ((expired, "-1 second"), (live, "60 seconds")):
            s.execute(
                text(
                    "UPDATE jobs SET state = 'running', lease_owner = 'busy', attempts = 2, "
                    "lease_expires_at = now() + CAST(:lease AS interval) WHERE gate_id = :g"
                ),
                {"g": gate_id, "lease": lease},
            )
    # The owner `busy` is alive (it holds a live lease), but only `live` is still its gate.
    of_finished = {"gate.gate_id": finished, "gate.owner": "busy"}
    of_expired = {"gate.gate_id": expired, "gate.owner": "busy"}
    of_live = {"gate.gate_id": live, "gate.owner": "busy"}
    of_live_by_another = {"gate.gate_id": live, "gate.owner": "previous-owner"}
    theirs = {"gate.gate_id": str(uuid.uuid4()), "gate.owner": "their-worker"}
    sandbox.containers = [of_finished, of_expired, of_live, of_live_by_another, theirs]
    worker._last_reap = 0.0  # as at start: a reaping pass is due
    # Nothing to claim (`expired` used its attempts: the pass ends it); the reaping ran.
    assert worker.run_once() is False
    assert sandbox.containers == [of_live, theirs]
    sandbox.containers.append(of_finished)
    worker.run_once()  # the next pass is REAP_EVERY_SECONDS away
    assert of_finished in sandbox.containers


@pytest.mark.parametrize("why", ["lease lost", "cancelled"])
def test_the_heartbeat_removes_only_this_workers_containers_of_the_gate(
    why: str,
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    sandbox: FakeSandbox,
    tmp_path: Path,
) -> None:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    gate_id, other_gate = submit(client, data), submit(client, data)
    worker = Worker(
        WorkerContext(
            settings=settings.model_copy(update={"job_lease_seconds": 5}),
            sessions=sessions,
            sandbox=sandbox,
            stop=threading.Event(),
        ),
        name="old-owner",
    )
    with session_scope(sessions) as s:
        job = jobs.claim(s, owner="old-owner", lease_seconds=60)
    assert job is not None and str(job.gate_id) == gate_id
    with session_scope(sessions) as s:
        if why == "lease lost":  # requeued and taken over by another worker
            s.execute(
                text("UPDATE jobs SET lease_owner = 'new-owner' WHERE id = :id"), {"id": job.id}
            )
        else:
            s.execute(
                text("UPDATE gates SET cancel_requested = true WHERE id = :g"), {"g": gate_id}
            )
    mine = {"gate.gate_id": gate_id, "gate.owner": "old-owner"}
    new_owners = {"gate.gate_id": gate_id, "gate.owner": "new-owner"}
    my_other_gate = {"gate.gate_id": other_gate, "gate.owner": "old-owner"}
    sandbox.containers = [mine, new_owners, my_other_gate]
    worker._heartbeat(job, threading.Event())  # returns once it saw the loss or the cancel
    assert job.halt.is_set()
    assert sandbox.containers == [new_owners, my_other_gate]


def test_the_next_case_starts_while_a_finished_case_is_stored(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    sandbox: FakeSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One case at a time: the first case's store is held until the second case has run,
    # which it can only do once the first has given its slot back.
    fake_wheels(monkeypatch, sandbox)
    one_at_a_time = fake_worker(
        settings.model_copy(update={"case_concurrency": 1}), sessions, sandbox
    )
    storing, release = threading.Event(), threading.Event()
    store = handler._store

    def held_store(*args: object, **kwargs: object) -> bool:
        if not storing.is_set():
            storing.set()
            assert release.wait(120), "the first case's store was never released"
        return store(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(handler, "_store", held_store)
    gate_id = submit(client, bundle_of(calculator_project(tmp_path / "p", failing=False)))
    judging = threading.Thread(target=one_at_a_time.run_once)
    judging.start()
    try:
        wait_until(storing.is_set, "the first case is being stored")
        wait_until(lambda: len(sandbox.runs) >= 2, "the second case runs meanwhile")
    finally:
        release.set()
        judging.join(60)
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert gate["status"] == "passed" and gate["judged_cases"] == gate["total_cases"]

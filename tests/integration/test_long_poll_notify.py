"""Long-polls wait on Postgres LISTEN/NOTIFY through one listener per API process (issue 12).

A waiter is woken by a change committed by another session, many idle waiters issue no
queries, and the listener reconnects after its connection is killed. On a real Postgres; no
timing comparisons, only events and generous deadlines.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from gate_service.app_state import state_of
from gate_service.auth.tokens import token_digest
from gate_service.db import session_scope
from gate_service.gates.notify import GateChanges, _change
from gate_service.gates.status_reads import StatusReads
from gate_service.models import ApiToken, Gate, utcnow
from tests.fixtures.auth import as_token, project_token
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.waiting import wait_until

DEADLINE_SECONDS = 30
WAIT = 60  # longer than any test waits for an answer: a 304 means nobody woke the waiter


@pytest.fixture
def changes(client: TestClient) -> GateChanges:
    hub = state_of(client.app).part(GateChanges)
    # Only a notification (or a reconnect) can wake a waiter within these tests.
    hub.recheck_seconds = 3600
    wait_until(lambda: hub.listening, "the listener listens")
    return hub


@pytest.fixture
def gate(client: TestClient, tmp_path: Path) -> tuple[str, str]:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    gate_id = client.post("/v1/gates", files={"bundle": ("p.tgz", data)}).json()["id"]
    etag = client.get(f"/v1/gates/{gate_id}").headers["ETag"]
    return gate_id, etag


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=32) as executor:
        yield executor


def bump(sessions: sessionmaker[Session], gate_id: str) -> None:
    """A visible change to the gate, committed by another session (as a worker makes it)."""
    with session_scope(sessions) as session:
        session.execute(
            update(Gate).where(Gate.id == uuid.UUID(gate_id)).values(revision=Gate.revision + 1)
        )


def long_poll(pool: ThreadPoolExecutor, client: TestClient, gate_id: str, etag: str) -> Future[Any]:
    def get() -> Any:
        return client.get(
            f"/v1/gates/{gate_id}", params={"wait": WAIT}, headers={"If-None-Match": etag}
        )

    return pool.submit(get)


def test_a_waiter_is_woken_by_a_change_from_another_session(
    client: TestClient,
    changes: GateChanges,
    gate: tuple[str, str],
    sessions: sessionmaker[Session],
    pool: ThreadPoolExecutor,
) -> None:
    gate_id, etag = gate
    waiting = long_poll(pool, client, gate_id, etag)
    wait_until(lambda: changes.sleeping == 1, "the long-poll waits")
    bump(sessions, gate_id)
    answer = waiting.result(timeout=DEADLINE_SECONDS)
    assert answer.status_code == 200
    assert answer.headers["ETag"] != etag
    assert answer.json()["id"] == gate_id
    # The new ETag is current: a plain read with it answers 304, the long-poll contract.
    again = client.get(f"/v1/gates/{gate_id}", headers={"If-None-Match": answer.headers["ETag"]})
    assert again.status_code == 304


def test_idle_waiters_issue_no_queries_and_one_change_answers_them_all(
    client: TestClient,
    changes: GateChanges,
    gate: tuple[str, str],
    sessions: sessionmaker[Session],
    pool: ThreadPoolExecutor,
) -> None:
    gate_id, etag = gate
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    engine = state_of(client.app).engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        waiters = [long_poll(pool, client, gate_id, etag) for _ in range(20)]
        wait_until(lambda: changes.sleeping == 20, "20 long-polls have read and wait")
        # Each has read its gate once; the old design then re-read it 4 times a second each.
        settled = len(statements)
        time.sleep(1.5)
        assert statements[settled:] == []
        bump(sessions, gate_id)
        answers = [w.result(timeout=DEADLINE_SECONDS) for w in waiters]
        woken = statements[settled:]
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert [a.status_code for a in answers] == [200] * 20
    assert len({a.content for a in answers}) == 1
    # One re-read each, not one per tick: its revision query and, when the serialised body
    # of the new revision is not cached yet, the full read (gate with bundle, cases, runs).
    assert sum(s.lstrip().startswith("SELECT gates.revision") for s in woken) == 20
    assert len(woken) <= 20 * 4


def test_waiters_of_other_gates_are_not_woken(
    client: TestClient,
    changes: GateChanges,
    gate: tuple[str, str],
    sessions: sessionmaker[Session],
    pool: ThreadPoolExecutor,
    tmp_path: Path,
) -> None:
    gate_id, etag = gate
    data = bundle_of(calculator_project(tmp_path / "q", failing=False))
    other = client.post("/v1/gates", files={"bundle": ("q.tgz", data)}).json()["id"]
    waiting = long_poll(pool, client, gate_id, etag)
    wait_until(lambda: changes.sleeping == 1, "the long-poll waits")
    heard = changes.notifications
    bump(sessions, other)
    wait_until(lambda: changes.notifications > heard, "the other gate's change is heard")
    assert not waiting.done()
    bump(sessions, gate_id)
    assert waiting.result(timeout=DEADLINE_SECONDS).status_code == 200


def test_the_listener_reconnects_after_its_connection_is_killed(
    client: TestClient,
    changes: GateChanges,
    gate: tuple[str, str],
    sessions: sessionmaker[Session],
    pool: ThreadPoolExecutor,
) -> None:
    gate_id, etag = gate
    waiting = long_poll(pool, client, gate_id, etag)
    wait_until(lambda: changes.sleeping == 1, "the long-poll waits")
    killed, connects = changes.backend_pid, changes.connects
    assert killed is not None
    with session_scope(sessions) as session:
        assert session.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": killed})
    wait_until(lambda: changes.connects > connects and changes.listening, "the listener reconnects")
    assert changes.backend_pid != killed
    # The waiter from before the kill still gets the change...
    bump(sessions, gate_id)
    first = waiting.result(timeout=DEADLINE_SECONDS)
    assert first.status_code == 200
    # ...and a new one is woken by a notification on the new connection.
    waiting = long_poll(pool, client, gate_id, first.headers["ETag"])
    wait_until(lambda: changes.sleeping == 1, "the second long-poll waits")
    bump(sessions, gate_id)
    second = waiting.result(timeout=DEADLINE_SECONDS)
    assert second.status_code == 200
    assert second.headers["ETag"] != first.headers["ETag"]


def test_a_deleted_gate_wakes_its_waiters_with_404(
    client: TestClient,
    changes: GateChanges,
    gate: tuple[str, str],
    sessions: sessionmaker[Session],
    pool: ThreadPoolExecutor,
) -> None:
    gate_id, etag = gate
    waiting = long_poll(pool, client, gate_id, etag)
    wait_until(lambda: changes.sleeping == 1, "the long-poll waits")
    with session_scope(sessions) as session:
        session.execute(text("DELETE FROM gates WHERE id = :id"), {"id": gate_id})
    assert waiting.result(timeout=DEADLINE_SECONDS).status_code == 404


def test_shutdown_stops_the_listener_and_closes_its_connection(
    settings: Any, sessions: sessionmaker[Session]
) -> None:
    from gate_service.main import create_app
    from tests.fixtures.auth import ADMIN_TOKEN, bearer

    with TestClient(create_app(settings), headers=bearer(ADMIN_TOKEN)) as c:
        hub = state_of(c.app).part(GateChanges)
        wait_until(lambda: hub.listening, "the listener listens")
        pid = hub.backend_pid
    assert not hub.listening

    def gone() -> bool:
        with session_scope(sessions) as session:
            return not session.scalar(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            )

    wait_until(gone, "the listening session ends")


def test_a_status_read_checks_its_token_as_every_route_does(
    client: TestClient, gate: tuple[str, str], sessions: sessionmaker[Session]
) -> None:
    # GET /v1/gates/{id} checks the token and reads the revision in one query, and serves a
    # cached body: none of that may skip a check, a write or the project scoping.
    gate_id, etag = gate
    path = f"/v1/gates/{gate_id}"
    assert client.get(path).status_code == 200  # the body of this revision is cached now
    body = client.post("/v1/projects/default/tokens", json={"scopes": ["read"]}).json()
    reader = as_token(client, body["token"])
    digest = token_digest(body["token"])

    def last_used() -> Any:
        with session_scope(sessions) as session:
            return session.scalar(
                select(ApiToken.last_used_at).where(ApiToken.token_sha256 == digest)
            )

    assert last_used() is None
    assert reader.get(path).headers["ETag"] == etag
    assert last_used() is not None  # a first use is recorded
    assert reader.get(path, headers={"If-None-Match": etag}).status_code == 304

    other = as_token(client, project_token(client, "other", ["read"]))
    assert other.get(path).status_code == 404
    submitter = as_token(client, project_token(client, "default", ["submit"]))
    assert submitter.get(path).status_code == 403
    assert as_token(client, "gate_not-a-token").get(path).status_code == 401
    assert as_token(client, None).get(path).status_code == 401

    with session_scope(sessions) as session:
        session.execute(
            update(ApiToken).where(ApiToken.token_sha256 == digest).values(expires_at=utcnow())
        )
    expired = reader.get(path)
    assert (expired.status_code, expired.json()["detail"]) == (401, "the token has expired")
    assert client.delete(f"/v1/tokens/{body['id']}").status_code == 200
    revoked = reader.get(path)
    assert (revoked.status_code, revoked.json()["detail"]) in {
        (401, "the token was revoked"),
        (401, "the token has expired"),
    }


def test_a_plain_read_after_a_change_gets_the_new_revision(
    client: TestClient, gate: tuple[str, str], sessions: sessionmaker[Session]
) -> None:
    gate_id, etag = gate
    before = client.get(f"/v1/gates/{gate_id}")
    with session_scope(sessions) as session:
        row = session.get_one(Gate, uuid.UUID(gate_id))
        row.failure_reason = "changed"
        row.revision += 1
    after = client.get(f"/v1/gates/{gate_id}", headers={"If-None-Match": etag})
    assert after.status_code == 200
    assert after.headers["ETag"] != before.headers["ETag"]
    assert after.json()["failure_reason"] == "changed"
    assert before.json()["failure_reason"] is None


def test_status_reads_survive_their_connections_being_killed(
    client: TestClient, gate: tuple[str, str], sessions: sessionmaker[Session]
) -> None:
    # The status read's own connections (gates/status_reads.py), as after a Postgres restart.
    gate_id, etag = gate
    path = f"/v1/gates/{gate_id}"
    assert client.get(path).status_code == 200
    with session_scope(sessions) as session:
        killed = session.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'gate-api-status' AND datname = current_database()"
            )
        )
    assert killed
    for _ in range(6):
        answer = client.get(path)
        assert (answer.status_code, answer.headers["ETag"]) == (200, etag)


def test_the_safety_recheck_covers_a_lost_notification(
    client: TestClient,
    changes: GateChanges,
    gate: tuple[str, str],
    sessions: sessionmaker[Session],
    pool: ThreadPoolExecutor,
) -> None:
    gate_id, etag = gate
    changes.recheck_seconds = 0.2
    waiting = long_poll(pool, client, gate_id, etag)
    wait_until(lambda: changes.sleeping == 1, "the long-poll waits")
    heard = changes.notifications
    with session_scope(sessions) as session:
        # Triggers off for this transaction (superuser): the change sends no notification.
        session.execute(text("SET LOCAL session_replication_role = replica"))
        session.execute(
            update(Gate).where(Gate.id == uuid.UUID(gate_id)).values(revision=Gate.revision + 1)
        )
    answer = waiting.result(timeout=DEADLINE_SECONDS)
    assert answer.status_code == 200
    assert changes.notifications == heard


def test_a_notification_during_the_health_check_is_not_lost(
    changes: GateChanges, gate: tuple[str, str], sessions: sessionmaker[Session]
) -> None:
    """A notification that arrives while the listener runs its `SELECT 1` health check is
    kept for the next `notifies()` (psycopg >= 3.2.4 keeps a backlog, and only while no
    notify handler is registered; older releases dropped it). Checked all the time here, so
    most changes land in one."""
    gate_id, _ = gate
    changes.health_check_seconds = 0.001
    try:
        for n in range(30):
            heard = changes.notifications
            bump(sessions, gate_id)
            wait_until(lambda h=heard: changes.notifications > h, f"change {n + 1} is heard")
    finally:
        changes.health_check_seconds = 30.0


def end(sessions: sessionmaker[Session], gate_id: str, status: str = "passed") -> None:
    """The gate ends, as the worker's last transaction of it commits."""
    with session_scope(sessions) as session:
        session.execute(
            update(Gate)
            .where(Gate.id == uuid.UUID(gate_id))
            .values(status=status, revision=Gate.revision + 1)
        )


def three_changes(changes: GateChanges, sessions: sessionmaker[Session], gate_id: str) -> None:
    """Three cases' worth of changes of a gate that has not ended, heard by a long-poll that
    is asleep again once they are (gathering them)."""
    heard = changes.notifications
    for _ in range(3):
        bump(sessions, gate_id)
    wait_until(lambda: changes.notifications >= heard + 3, "the three changes are heard")
    wait_until(lambda: changes.sleeping == 1, "the long-poll gathers, asleep again")


def test_changes_of_a_running_gate_are_gathered_and_its_end_is_answered_at_once(
    client: TestClient,
    changes: GateChanges,
    gate: tuple[str, str],
    sessions: sessionmaker[Session],
    pool: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Gathering for an hour: only the end can answer this long-poll within the test.
    monkeypatch.setattr(state_of(client.app).settings, "long_poll_settle_seconds", 3600)
    gate_id, etag = gate
    waiting = long_poll(pool, client, gate_id, etag)
    wait_until(lambda: changes.sleeping == 1, "the long-poll waits")
    three_changes(changes, sessions, gate_id)
    time.sleep(1.0)  # answered per change, the answer would be on its way by now
    assert not waiting.done()
    end(sessions, gate_id)
    answer = waiting.result(timeout=DEADLINE_SECONDS)
    assert answer.status_code == 200 and answer.json()["status"] == "passed"
    current = client.get(f"/v1/gates/{gate_id}", headers={"If-None-Match": answer.headers["ETag"]})
    assert current.status_code == 304  # the answer holds every change, the end's included


def test_a_gathered_change_is_answered_once_the_settle_time_is_over(
    client: TestClient,
    changes: GateChanges,
    gate: tuple[str, str],
    sessions: sessionmaker[Session],
    pool: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(state_of(client.app).settings, "long_poll_settle_seconds", 0.2)
    gate_id, etag = gate
    waiting = long_poll(pool, client, gate_id, etag)  # WAIT is 60 s: a 304 would fail this
    wait_until(lambda: changes.sleeping == 1, "the long-poll waits")
    bump(sessions, gate_id)
    answer = waiting.result(timeout=DEADLINE_SECONDS)
    assert answer.status_code == 200 and answer.json()["status"] == "queued"
    assert answer.headers["ETag"] != etag


def test_a_told_change_costs_a_long_poll_no_query_and_a_bare_id_one(
    client: TestClient,
    changes: GateChanges,
    gate: tuple[str, str],
    sessions: sessionmaker[Session],
    pool: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Since migration 0015 a notification says the gate's new revision and status: a
    # long-poll of a running gate learns from it whether to answer, where it used to ask
    # Postgres twice a case. A notification with the id alone (a trigger from before 0015)
    # is still answered, by asking.
    monkeypatch.setattr(state_of(client.app).settings, "long_poll_settle_seconds", 3600)
    reads = state_of(client.app).part(StatusReads)
    gate_id, etag = gate
    waiting = long_poll(pool, client, gate_id, etag)
    wait_until(lambda: changes.sleeping == 1, "the long-poll waits")
    asked = reads.queries
    three_changes(changes, sessions, gate_id)
    assert reads.queries == asked
    with session_scope(sessions) as session:
        # The end, with the triggers off for this transaction (superuser), then a bare id.
        session.execute(text("SET LOCAL session_replication_role = replica"))
        session.execute(
            update(Gate)
            .where(Gate.id == uuid.UUID(gate_id))
            .values(status="passed", revision=Gate.revision + 1)
        )
        session.execute(text("SELECT pg_notify('gate_changed', :g)"), {"g": gate_id})
    answer = waiting.result(timeout=DEADLINE_SECONDS)
    assert answer.status_code == 200 and answer.json()["status"] == "passed"
    assert reads.queries == asked + 1


def test_a_notification_tells_the_revision_and_status_it_carries(
    changes: GateChanges, gate: tuple[str, str], sessions: sessionmaker[Session]
) -> None:
    gate_id, _ = gate
    with changes.subscribe(uuid.UUID(gate_id)) as waiter:
        heard = changes.notifications
        end(sessions, gate_id, status="failed")
        wait_until(lambda: changes.notifications > heard, "the end is heard")
        with session_scope(sessions) as session:
            revision = session.scalars(
                select(Gate.revision).where(Gate.id == uuid.UUID(gate_id))
            ).one()
        assert waiter.heard == (revision, "failed")
        waiter.clear()
        assert waiter.heard is None
        waiter.wake((revision + 2, "running"))
        waiter.wake((revision + 1, "passed"))  # an older one told later: the newest is kept
        assert waiter.heard == (revision + 2, "running")
        waiter.wake(None)  # one that did not say: only a read knows
        assert waiter.heard is None


@pytest.mark.parametrize(
    ("tail", "told"),
    [
        ("12 running", (12, "running")),
        ("", None),
        ("12", None),
        ("x running", None),
        ("-1 running", None),
        ("12 running extra", None),
    ],
)
def test_a_payload_tail_is_read_strictly(tail: str, told: tuple[int, str] | None) -> None:
    assert _change(tail) == told

"""A project's case history, `GET /v1/projects/{name}/cases` (baselines issue, item 1), and
what a gate and its cases answer of baselines (items 3 and 4): real Postgres and app, gates
and cases written straight to the database as the worker leaves them.

Each case identity is listed once, by suite, agent and test name, with its last
GATE_HISTORY_GATES gates (here 4) and figures over its last 4 judged gates with its latest
closure hash: reused verdicts, unjudged cases, other closures and other projects left out.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from gate_service.baselines.closure import case_key
from gate_service.baselines.stats import wilson
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.models import Bundle, Case, CaseQuarantine, Gate, Project, utcnow
from tests.fixtures.auth import as_token, project_token

A = ("tests/bot.yaml", "bot", "greets")
B = ("tests/bot.yaml", "bot", "refunds")
C = ("tests/planner.yaml", "planner", "plans")
FLAKY = {"gates": 4, "passed_gates": 3, "successes": 15, "runs": 18, "low": 60.8, "high": 94.2}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"history_gates": 4})


def project_id(sessions: sessionmaker[Session], name: str) -> uuid.UUID:
    with session_scope(sessions) as s:
        found = s.scalar(select(Project.id).where(Project.name == name))
        if found is None:
            project = Project(name=name)
            s.add(project)
            s.flush()
            found = project.id
        return found


def add_gate(
    sessions: sessionmaker[Session],
    project: uuid.UUID,
    at: datetime,
    cases: list[tuple[tuple[str, str, str], dict[str, Any]]],
    *,
    status: str = "passed",
    **gate_fields: Any,
) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """A gate of ``project`` created at ``at``, with these cases (identity, column values)."""
    with session_scope(sessions) as s:
        if s.get(Bundle, "0" * 64) is None:
            s.add(
                Bundle(
                    sha256="0" * 64, archive_format="tar.gz", size_bytes=1, code_bytes=1,
                    fixture_bytes=0,
                )
            )  # fmt: skip
            s.flush()
        gate = Gate(
            project_id=project,
            bundle_sha256="0" * 64,
            status=status,
            phase="done" if status in ("passed", "failed") else "running_tests",
            created_at=at,
            labels={},
            problems=[],
            **gate_fields,
        )
        s.add(gate)
        s.flush()
        rows = []
        for position, ((suite, agent, test), values) in enumerate(cases):
            row = Case(
                gate_id=gate.id,
                position=position,
                suite=suite,
                agent_name=agent,
                test_name=test,
                timeout_s=60,
                case_key=case_key(suite, agent, test),
                **{"success_threshold": 80, "runs": 5, "status": "passed"} | values,
            )
            row.passed = {"passed": True, "failed": False}.get(row.status)
            s.add(row)
            rows.append(row)
        s.flush()
        return gate.id, [r.id for r in rows]


@pytest.fixture
def shop(client: TestClient, sessions: sessionmaker[Session]) -> dict[str, Any]:
    """Project `shop` with seven gates, an hour apart (g1 the oldest):

    A: closure c1 in g1-g2; c2 in g3-g6 (g5 reused its baseline's verdict, g6 stopped early
       after 3 of 5 runs); g7 is running it under a new closure c3, not judged yet.
    B: six judged gates of closure b1, 2 runs each: 0, 0, 2, 2, 2, 1 successes.
    C: only in g7, queued.
    """
    reader = as_token(client, project_token(client, "shop", ["read"]))
    pid = project_id(sessions, "shop")
    start = utcnow() - timedelta(hours=10)
    a = {
        1: {"status": "passed", "successes": 5, "closure_hash": "c1"},
        2: {"status": "failed", "successes": 2, "closure_hash": "c1"},
        3: {"status": "passed", "successes": 4, "closure_hash": "c2"},
        4: {"status": "failed", "successes": 3, "closure_hash": "c2"},
        5: {"status": "passed", "successes": 5, "closure_hash": "c2", "reused_from": uuid.uuid4()},
        6: {
            "status": "passed", "successes": 3, "closure_hash": "c2", "invocations_run": 3,
            "stopped_early": True, "flaky": FLAKY,
        },
        7: {"status": "running", "successes": 1, "closure_hash": "c3"},
    }  # fmt: skip
    b = [0, 0, 2, 2, 2, 1]
    gates = []
    for n in range(1, 8):
        cases = [(A, a[n])]
        if n <= 6:
            cases.append(
                (B, {"status": "passed" if b[n - 1] else "failed", "successes": b[n - 1],
                     "runs": 2, "success_threshold": 50, "closure_hash": "b1"})
            )  # fmt: skip
        else:
            cases.append((C, {"status": "queued", "successes": 0, "closure_hash": "p1"}))
        status = "running" if n == 7 else ("passed" if a[n]["status"] == "passed" else "failed")
        gates.append(add_gate(sessions, pid, start + timedelta(hours=n), cases, status=status)[0])
    return {"reader": reader, "gates": gates, "project_id": pid}


def figures(item: dict[str, Any]) -> tuple[Any, ...]:
    return (
        item["closure_hash"], item["gates"], item["passed_gates"], item["successes"],
        item["runs"], item["pass_rate"],
    )  # fmt: skip


def test_each_case_s_history_and_figures_over_its_latest_closure(
    shop: dict[str, Any], client: TestClient, sessions: sessionmaker[Session]
) -> None:
    # Another project's gate of the same identity (case keys are per name, not per
    # project), newer than all: never counted, never shown.
    other = project_id(sessions, "other")
    add_gate(sessions, other, utcnow(), [(A, {"status": "failed", "successes": 0,
                                              "closure_hash": "c2"})], status="failed")  # fmt: skip
    r = shop["reader"].get("/v1/projects/shop/cases")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["project"], body["history_gates"], body["total"]) == ("shop", 4, 3)
    assert (body["limit"], body["offset"]) == (50, 0)
    a, b, c = body["items"]
    assert [(i["suite"], i["agent_name"], i["test_name"]) for i in (a, b, c)] == [A, B, C]
    assert a["case_key"] == case_key(*A)
    g = [str(x) for x in shop["gates"]]

    # A: g7 runs a new closure not judged yet, so the figures are of the newest judged
    # closure (c2): g6 (3 of 3 run), g4 (3/5), g3 (4/5); g5 reused a verdict, not counted.
    assert figures(a) == ("c2", 3, 2, 10, 13, round(100 * 10 / 13, 2))
    interval = wilson(10, 13)
    assert a["interval"] == {"low": interval.low, "high": interval.high}
    assert (round(a["interval"]["low"], 1), round(a["interval"]["high"], 1)) == (49.7, 91.8)
    assert a["success_threshold"] == 80 and a["narrow"] is True  # 80 lies inside
    assert a["flaky"] == FLAKY  # the newest judged case's
    assert a["quarantine"] is None
    # Its last 4 gates, newest first, whatever their closure.
    assert [
        (e["gate_id"], e["gate_status"], e["status"], e["successes"], e["runs"],
         e["closure_hash"], e["stopped_early"], e["reused"])
        for e in a["recent"]
    ] == [
        (g[6], "running", "running", 1, 5, "c3", False, False),
        (g[5], "passed", "passed", 3, 3, "c2", True, False),
        (g[4], "passed", "passed", 5, 5, "c2", False, True),
        (g[3], "failed", "failed", 3, 5, "c2", False, False),
    ]  # fmt: skip
    assert all(e["case_id"] and e["created_at"] for e in a["recent"])

    # B: one closure over six judged gates; only the last 4 count (2, 2, 2, 1 of 2 each).
    assert figures(b) == ("b1", 4, 4, 7, 8, 87.5)
    interval = wilson(7, 8)
    assert b["interval"] == {"low": interval.low, "high": interval.high}
    assert b["success_threshold"] == 50 and b["narrow"] is False  # 50 lies below 52.9
    assert b["flaky"] is None
    assert [e["successes"] for e in b["recent"]] == [1, 2, 2, 2]

    # C: never judged: its closure is its newest case's, and no figures.
    assert figures(c) == ("p1", 0, 0, 0, 0, None)
    assert (c["interval"], c["narrow"], c["flaky"]) == (None, False, None)
    assert [(e["gate_id"], e["status"]) for e in c["recent"]] == [(g[6], "queued")]

    # The other project sees only its own.
    stranger = as_token(client, project_token(client, "other", ["read"]))
    mine = stranger.get("/v1/projects/other/cases").json()
    assert mine["total"] == 1
    assert figures(mine["items"][0]) == ("c2", 1, 0, 0, 5, 0.0)


def test_pages_of_identities_by_name(shop: dict[str, Any]) -> None:
    reader = shop["reader"]

    def page(**params: int) -> tuple[list[str], int]:
        r = reader.get("/v1/projects/shop/cases", params=params)
        assert r.status_code == 200, r.text
        return [i["test_name"] for i in r.json()["items"]], r.json()["total"]

    assert page(limit=2) == (["greets", "refunds"], 3)
    assert page(limit=2, offset=2) == (["plans"], 3)
    assert page(limit=1, offset=1) == (["refunds"], 3)
    assert page(offset=3) == ([], 3)  # past the end: still the total
    assert page(offset=1_000_000) == ([], 3)
    for params in ({"limit": 0}, {"limit": 201}, {"offset": -1}, {"offset": 1_000_001},
                   {"limit": "x"}):  # fmt: skip
        r = reader.get("/v1/projects/shop/cases", params=params)
        assert r.status_code == 422, r.text
        assert set(r.json()) == {"error", "detail", "problems"}


@pytest.fixture
def statements() -> Iterator[list[str]]:
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def test_a_page_costs_the_same_statements_whatever_its_size(
    shop: dict[str, Any], sessions: sessionmaker[Session], statements: list[str]
) -> None:
    # Many more identities and gates: a page of 1 and a page of 30 read alike.
    pid = shop["project_id"]
    start = utcnow() - timedelta(days=2)
    for n in range(12):
        add_gate(
            sessions, pid, start + timedelta(minutes=n),
            [((f"tests/s{i}.yaml", "bot", f"t{i}"), {"successes": 5, "closure_hash": "x"})
             for i in range(30)],
        )  # fmt: skip
    reader = shop["reader"]
    costs = []
    for limit in (1, 30):
        statements.clear()
        r = reader.get("/v1/projects/shop/cases", params={"limit": limit})
        assert r.status_code == 200 and len(r.json()["items"]) == limit
        costs.append(len([s for s in statements if "cases" in s]))
    assert costs[0] == costs[1] == 2, costs
    item = next(i for i in r.json()["items"] if i["test_name"] == "t1")
    assert figures(item) == ("x", 4, 4, 20, 20, 100.0)
    assert len(item["recent"]) == 4


def test_who_may_read_a_project_s_cases(shop: dict[str, Any], client: TestClient) -> None:
    assert shop["reader"].get("/v1/projects/shop/cases").status_code == 200
    assert client.get("/v1/projects/shop/cases").status_code == 200  # an admin of default
    submitter = as_token(client, project_token(client, "shop", ["submit"]))
    assert submitter.get("/v1/projects/shop/cases").status_code == 403
    stranger = as_token(client, project_token(client, "other", ["admin"]))
    r = stranger.get("/v1/projects/shop/cases")
    assert r.status_code == 404 and "shop" in r.json()["detail"]
    assert as_token(client, None).get("/v1/projects/shop/cases").status_code == 401
    for name in ("nobody", "a%00b", "a" * 300):
        assert shop["reader"].get(f"/v1/projects/{name}/cases").status_code == 404


def test_an_active_quarantine_shows_in_the_history_an_ended_one_does_not(
    shop: dict[str, Any], client: TestClient, sessions: sessionmaker[Session]
) -> None:
    ends = (utcnow() + timedelta(days=3)).replace(microsecond=0)
    r = client.post(
        "/v1/projects/shop/quarantine",
        json={"case": dict(zip(("suite", "agent_name", "test_name"), A, strict=True)),
              "owner": "ana@example.com", "reason": "vendor outage", "expires_at": ends.isoformat()},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    with session_scope(sessions) as s:
        s.add(
            CaseQuarantine(
                project_id=shop["project_id"], case_key=case_key(*B), suite=B[0],
                agent_name=B[1], test_name=B[2], owner="bo", reason="old",
                expires_at=utcnow() - timedelta(minutes=1),
            )
        )  # fmt: skip
    a, b, _ = shop["reader"].get("/v1/projects/shop/cases").json()["items"]
    assert a["quarantine"]["owner"] == "ana@example.com"
    assert a["quarantine"]["active"] is True
    assert a["quarantine"]["expires_at"].startswith(ends.strftime("%Y-%m-%dT%H:%M:%S"))
    assert b["quarantine"] is None


# -- a gate's and its cases' answers -------------------------------------------------------


def test_a_gate_and_its_cases_answer_their_baseline_intervals_and_flags(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    pid = project_id(sessions, "default")
    base_id, (base_case,) = add_gate(
        sessions, pid, utcnow() - timedelta(hours=1), [(A, {"successes": 10, "runs": 10})]
    )
    compared = {
        "gate_id": str(base_id), "case_id": str(base_case), "successes": 10, "runs": 10,
        "comparable": True, "why": None, "p_value": 0.000357, "drop_points": 80.0,
    }  # fmt: skip
    quarantine = {
        "owner": "ana",
        "reason": "flaky vendor",
        "expires_at": "2030-01-01T00:00:00+00:00",
    }
    gate_id, _ = add_gate(
        sessions,
        pid,
        utcnow(),
        [
            (A, {"status": "failed", "successes": 2, "runs": 10, "baseline": compared,
                 "regression_level": "regression", "quarantine": quarantine,
                 "closure_hash": "c", "definition_hash": "d"}),
            (B, {"status": "passed", "successes": 1, "runs": 1}),
            (C, {"status": "passed", "successes": 3, "runs": 5, "invocations_run": 3,
                 "stopped_early": True, "success_threshold": 60}),
        ],
        status="passed",
        baseline="label:branch=main",
        baseline_gate_id=base_id,
        changed_only=True,
    )  # fmt: skip
    gate = client.get(f"/v1/gates/{gate_id}").json()
    assert (gate["baseline"], gate["baseline_gate_id"], gate["changed_only"]) == (
        "label:branch=main", str(base_id), True,
    )  # fmt: skip
    a, b, c = gate["cases"]
    assert a["baseline"] == compared | {"gate_id": str(base_id), "case_id": str(base_case)}
    assert (a["regression_level"], a["regression"]) == ("regression", True)
    assert a["quarantine"] == {
        "owner": "ana", "reason": "flaky vendor", "expires_at": "2030-01-01T00:00:00Z",
    }  # fmt: skip
    low, high = wilson(2, 10).low, wilson(2, 10).high
    assert (a["interval"], a["narrow"]) == ({"low": low, "high": high}, False)  # 80 > 51
    assert (a["case_key"], a["closure_hash"], a["definition_hash"]) == (case_key(*A), "c", "d")
    assert (b["interval"], b["narrow"], b["regression"]) == (None, False, False)  # one run
    interval = wilson(3, 3)  # the 3 it ran: 43.9-100, which holds 60
    assert (c["interval"], c["narrow"]) == ({"low": interval.low, "high": interval.high}, True)
    assert (c["stopped_early"], c["invocations_run"], c["reused_from"]) == (True, 3, None)
    # The page of cases answers the same.
    page = client.get(f"/v1/gates/{gate_id}/cases").json()["items"]
    assert page == gate["cases"]
    # Connic's test run keeps the platform's case shape: none of it.
    run = client.get(f"/v1/projects/default/test-runs/{gate_id}").json()
    for case in run["cases"]:
        assert set(case) == {
            "agent_name", "test_name", "passed", "successes", "runs", "success_threshold",
            "failure_reason", "agent_run_ids", "agent_run_passed",
        }  # fmt: skip

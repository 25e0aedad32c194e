"""Quarantines and the verdict rule (baselines issue, item 4's admin side): set, listed,
replaced and cleared by a project's admin only, each change audited; an end that is required,
ahead and at most GATE_MAX_QUARANTINE_DAYS away; hostile text refused in the one error shape
and never stored; an ended quarantine is no longer active. `gate admin` drives the same
routes. Real Postgres and app.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from gate_service.baselines.closure import case_key
from gate_service.cli import main
from gate_service.db import session_scope
from gate_service.models import AuditEvent, Bundle, Case, CaseQuarantine, Gate, Project, utcnow
from tests.fixtures.auth import ADMIN_TOKEN, as_token, project_token
from tests.fixtures.live import live_server  # noqa: F401 (fixture)

CASE = {"suite": "tests/bot.yaml", "agent_name": "bot", "test_name": "greets"}
URL = "/v1/projects/shop/quarantine"


def later(**delta: float) -> str:
    return (utcnow() + timedelta(**delta)).isoformat()


def body(**fields: Any) -> dict[str, Any]:
    return {
        "case": CASE,
        "owner": "ana@example.com",
        "reason": "the vendor's sandbox is down",
        "expires_at": later(days=7),
    } | fields


def seed_case(sessions: sessionmaker[Session], project: str, case: dict[str, str] = CASE) -> None:
    """A judged case of ``project`` (made if new), as a gate's worker leaves it."""
    with session_scope(sessions) as s:
        pid = s.scalar(select(Project.id).where(Project.name == project))
        if pid is None:
            row = Project(name=project)
            s.add(row)
            s.flush()
            pid = row.id
        if s.get(Bundle, "0" * 64) is None:
            s.add(Bundle(sha256="0" * 64, archive_format="tar.gz", size_bytes=1, code_bytes=1,
                         fixture_bytes=0))  # fmt: skip
            s.flush()
        gate = Gate(project_id=pid, bundle_sha256="0" * 64, status="failed", labels={},
                    problems=[])  # fmt: skip
        s.add(gate)
        s.flush()
        s.add(
            Case(gate_id=gate.id, position=0, runs=1, success_threshold=100, timeout_s=60,
                 status="failed", passed=False, successes=0,
                 case_key=case_key(case["suite"], case["agent_name"], case["test_name"]),
                 **case)
        )  # fmt: skip


@pytest.fixture
def shop(client: TestClient, sessions: sessionmaker[Session]) -> TestClient:
    """Project shop with one judged case, and a client holding an admin token of shop."""
    admin = as_token(client, project_token(client, "shop", ["admin"]))
    seed_case(sessions, "shop")
    return admin


def refused(response: Any, location: str, *says: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    answer: dict[str, Any] = response.json()
    assert set(answer) == {"error", "detail", "problems"}, answer
    assert answer["error"] == "RequestInvalid"
    assert location in [p["location"] for p in answer["problems"]], answer
    for said in says:
        assert said in answer["detail"], answer["detail"]
    return answer


def stored(sessions: sessionmaker[Session]) -> int:
    with session_scope(sessions) as s:
        return int(s.scalar(select(func.count()).select_from(CaseQuarantine)) or 0)


def test_an_admin_sets_lists_replaces_and_clears_a_quarantine_each_change_audited(
    shop: TestClient,
) -> None:
    ends = later(days=7)
    r = shop.post(URL, json=body(expires_at=ends))
    assert r.status_code == 201, r.text
    first = r.json()
    assert first["case"] == CASE
    assert first["case_key"] == case_key(*CASE.values())
    assert (first["project"], first["owner"], first["active"]) == ("shop", "ana@example.com", True)
    assert datetime.fromisoformat(first["expires_at"]) == datetime.fromisoformat(ends)
    assert first["created_by"]

    listed = shop.get(URL).json()
    assert (listed["project"], listed["total"]) == ("shop", 1)
    assert [q["id"] for q in listed["items"]] == [first["id"]]

    # Setting it again replaces it (200), same id, new owner and end.
    r = shop.post(URL, json=body(owner="bo", reason="still down", expires_at=later(days=30)))
    assert r.status_code == 200, r.text
    second = r.json()
    assert (second["id"], second["owner"], second["reason"]) == (first["id"], "bo", "still down")
    assert shop.get(URL).json()["total"] == 1

    r = shop.delete(f"{URL}/{first['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["id"] == first["id"] and r.json()["owner"] == "bo"
    assert shop.get(URL).json() == {
        "project": "shop", "items": [], "total": 0, "limit": 100, "offset": 0,
    }  # fmt: skip
    assert shop.delete(f"{URL}/{first['id']}").status_code == 404

    actions = ["case.quarantined", "case.quarantine_cleared"]
    events = shop.get("/v1/audit", params={"action": actions}).json()["items"]
    got = [(e["action"], e["detail"]) for e in reversed(events)]
    assert [a for a, _ in got] == ["case.quarantined", "case.quarantined",
                                   "case.quarantine_cleared"]  # fmt: skip
    (_, set1), (_, set2), (_, cleared) = got
    assert set1["project"] == "shop" and set1["case"] == CASE
    assert (set1["owner"], set1["quarantine"], set1["replaced"]) == (
        "ana@example.com", first["id"], None,
    )  # fmt: skip
    assert set2["replaced"]["owner"] == "ana@example.com"
    assert set2["reason"] == "still down"
    assert (cleared["quarantine"], cleared["case"], cleared["was_active"]) == (
        first["id"], CASE, True,
    )  # fmt: skip
    assert all(e["token_id"] == first["created_by"] for e in events)


def test_only_the_project_s_admins_touch_its_quarantines(
    shop: TestClient, client: TestClient, sessions: sessionmaker[Session]
) -> None:
    made = shop.post(URL, json=body()).json()
    reader = as_token(client, project_token(client, "shop", ["read", "submit"]))
    for r in (
        reader.post(URL, json=body()),
        reader.get(URL),
        reader.delete(f"{URL}/{made['id']}"),
    ):
        assert r.status_code == 403, r.text
        assert "admin scope" in r.json()["detail"]
    stranger = as_token(client, project_token(client, "other", ["admin"]))
    for r in (
        stranger.post(URL, json=body()),
        stranger.get(URL),
        stranger.delete(f"{URL}/{made['id']}"),
        # Its own project's URL with shop's quarantine id: not its quarantine.
        stranger.delete(f"/v1/projects/other/quarantine/{made['id']}"),
    ):
        assert r.status_code == 404, r.text
    # Its own project does not hold shop's case either.
    refused(stranger.post("/v1/projects/other/quarantine", json=body()), "body.case")
    assert as_token(client, None).get(URL).status_code == 401
    assert shop.get(URL).json()["items"][0]["owner"] == "ana@example.com"  # untouched

    # An admin of `default` administers every project; the event is shop's, where its admins
    # read it.
    r = client.post(URL, json=body(owner="ops"))
    assert r.status_code == 200, r.text
    events = shop.get("/v1/audit", params={"action": "case.quarantined"}).json()["items"]
    assert [e["detail"]["owner"] for e in events] == ["ops", "ana@example.com"]


def test_the_end_is_required_ahead_and_within_the_limit(
    shop: TestClient, sessions: sessionmaker[Session]
) -> None:
    refused(shop.post(URL, json=body(expires_at=later(minutes=-1))), "body.expires_at",
            "is not in the future")  # fmt: skip
    refused(shop.post(URL, json=body(expires_at="2001-01-01T00:00:00Z")), "body.expires_at")
    refused(shop.post(URL, json=body(expires_at=later(days=90, minutes=5))), "body.expires_at",
            "more than 90 days ahead", "GATE_MAX_QUARANTINE_DAYS")  # fmt: skip
    refused(shop.post(URL, json=body(expires_at="9999-12-31T23:59:59Z")), "body.expires_at")
    no_end = body()
    del no_end["expires_at"]
    refused(shop.post(URL, json=no_end), "body.expires_at", "Field required")
    refused(shop.post(URL, json=body(expires_at="next tuesday")), "body.expires_at")
    assert stored(sessions) == 0
    # Just within the limit, and an end without an offset (UTC).
    r = shop.post(URL, json=body(expires_at=later(days=90, minutes=-5)))
    assert r.status_code == 201, r.text
    naive = (utcnow() + timedelta(days=1)).replace(tzinfo=None, microsecond=0).isoformat()
    r = shop.post(URL, json=body(expires_at=naive))
    assert r.status_code == 200, r.text
    assert datetime.fromisoformat(r.json()["expires_at"]).utcoffset() == timedelta(0)


def test_owner_reason_and_case_are_required_bounded_and_storable(
    shop: TestClient, sessions: sessionmaker[Session]
) -> None:
    for field in ("owner", "reason", "case"):
        missing = body()
        del missing[field]
        refused(shop.post(URL, json=missing), f"body.{field}", "Field required")
    refused(shop.post(URL, json=body(owner="")), "body.owner")
    refused(shop.post(URL, json=body(owner="   ")), "body.owner", "blank")
    refused(shop.post(URL, json=body(reason="\n\t ")), "body.reason", "blank")
    refused(shop.post(URL, json=body(owner="ana\nX-Admin: yes")), "body.owner",
            "U+000A at position 4")  # fmt: skip
    refused(shop.post(URL, json=body(owner="a\u202eb")), "body.owner", "U+202E")
    refused(shop.post(URL, json=body(extra=1)), "body.extra")
    refused(shop.post(URL, json=body(case={**CASE, "agent": "bot"})), "body.case.agent")
    refused(shop.post(URL, json=body(case="tests/bot.yaml::greets")), "body.case")
    # A case no gate of the project holds (a typo) is named, not quietly quarantined.
    typo = {**CASE, "test_name": "greet"}
    refused(shop.post(URL, json=body(case=typo)), "body.case", "bot::greet of tests/bot.yaml",
            "GET /v1/projects/shop/cases")  # fmt: skip
    assert stored(sessions) == 0


@pytest.mark.parametrize(
    ("fields", "location"),
    [
        ({"owner": "a" * 1_000_000}, "body.owner"),
        ({"reason": "r" * 1_000_000}, "body.reason"),
        ({"case": {**CASE, "suite": "s" * 1_000_000}}, "body.case.suite"),
        ({"case": {**CASE, "test_name": "t" * 5000}}, "body.case.test_name"),
        ({"owner": "ana\x00"}, "body.owner"),
        ({"reason": "why\x00not"}, "body.reason"),
        ({"case": {**CASE, "test_name": "greets\x00"}}, "body.case.test_name"),
        ({"case": {**CASE, "agent_name": None}}, "body.case.agent_name"),
        ({"owner": ["ana"]}, "body.owner"),
        ({"expires_at": 10**30}, "body.expires_at"),
    ],
)
def test_hostile_input_is_a_422_in_the_error_shape_and_stores_nothing(
    shop: TestClient, sessions: sessionmaker[Session], fields: dict[str, Any], location: str
) -> None:
    started = time.perf_counter()
    answer = refused(shop.post(URL, json=body(**fields)), location)
    assert time.perf_counter() - started < 5
    assert len(json.dumps(answer)) < 5000  # the input is not echoed back
    assert stored(sessions) == 0


def test_lone_surrogates_and_broken_json_are_refused(
    shop: TestClient, sessions: sessionmaker[Session]
) -> None:
    text = json.dumps(body())
    for broken in (
        text.replace('"ana@example.com"', '"ana\\ud800"'),
        text.replace('"greets"', '"greets\\udfff"'),
        text[:-5],
        "[]",
        "null",
    ):
        r = shop.post(URL, content=broken.encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (broken[:80], r.text)
        assert set(r.json()) == {"error", "detail", "problems"}
    for bad_id in ("not-a-uuid", "%00", "1" * 500):
        r = shop.delete(f"{URL}/{bad_id}")
        assert r.status_code in (404, 422), r.text
        assert set(r.json()) == {"error", "detail", "problems"}
    assert shop.delete(f"{URL}/{uuid.uuid4()}").status_code == 404
    assert stored(sessions) == 0


def test_an_ended_quarantine_is_not_active_and_stays_listed_a_while(
    shop: TestClient, client: TestClient, sessions: sessionmaker[Session]
) -> None:
    other_case = {**CASE, "test_name": "refunds"}
    seed_case(sessions, "shop", other_case)
    made = shop.post(URL, json=body()).json()
    old = shop.post(URL, json=body(case=other_case)).json()
    # Time passes: the first ended a minute ago, the second 31 days ago.
    with session_scope(sessions) as s:
        for qid, ago in ((made["id"], timedelta(minutes=1)), (old["id"], timedelta(days=31))):
            s.execute(
                update(CaseQuarantine)
                .where(CaseQuarantine.id == uuid.UUID(qid))
                .values(expires_at=utcnow() - ago)
            )
    listed = shop.get(URL).json()
    assert [(q["id"], q["active"]) for q in listed["items"]] == [(made["id"], False)]
    assert listed["total"] == 1
    history = shop.get("/v1/projects/shop/cases").json()["items"]
    assert all(item["quarantine"] is None for item in history)
    # Set again, it holds again (the row replaced: 200).
    r = shop.post(URL, json=body())
    assert (r.status_code, r.json()["active"], r.json()["id"]) == (200, True, made["id"])
    listed = shop.get(URL).json()
    assert [(q["id"], q["active"]) for q in listed["items"]] == [(made["id"], True)]
    # An ended one can be cleared too.
    assert shop.delete(f"{URL}/{old['id']}").status_code == 200


def test_the_list_is_paged_active_first_soonest_to_end_first(
    shop: TestClient, sessions: sessionmaker[Session]
) -> None:
    names = [f"case_{i}" for i in range(5)]
    for i, name in enumerate(names):
        seed_case(sessions, "shop", {**CASE, "test_name": name})
        r = shop.post(URL, json=body(case={**CASE, "test_name": name},
                                     expires_at=later(days=10 - i)))  # fmt: skip
        assert r.status_code == 201, r.text
    with session_scope(sessions) as s:
        s.execute(
            update(CaseQuarantine)
            .where(CaseQuarantine.test_name == "case_4")
            .values(expires_at=utcnow() - timedelta(days=1))
        )
    page = shop.get(URL, params={"limit": 2}).json()
    assert (page["total"], page["limit"]) == (5, 2)
    assert [q["case"]["test_name"] for q in page["items"]] == ["case_3", "case_2"]
    rest = shop.get(URL, params={"limit": 10, "offset": 2}).json()["items"]
    assert [(q["case"]["test_name"], q["active"]) for q in rest] == [
        ("case_1", True), ("case_0", True), ("case_4", False),
    ]  # fmt: skip
    assert shop.get(URL, params={"limit": 0}).status_code == 422
    assert shop.get(URL, params={"offset": -1}).status_code == 422


TEXTS = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["ana", "", " ", "a\x00b", "\u202e", "x" * 201, "y" * 2001, "\r\n"]),
)
ENDS = st.one_of(
    st.sampled_from(
        [
            later(days=1), later(days=89), later(days=91), later(minutes=-1), "2001-01-01",
            "9999-12-31T23:59:59Z", "0000-00-00", "", "now", "2027-02-30T00:00:00",
            "2027-01-01T00:00:00+25:00", "2027-01-01T00:00:00.123456789Z",
        ]
    ),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)  # fmt: skip
CASES = st.one_of(
    st.just(CASE),
    st.fixed_dictionaries({"suite": TEXTS, "agent_name": TEXTS, "test_name": TEXTS}),
    st.dictionaries(TEXTS, TEXTS, max_size=3),
    TEXTS,
    st.none(),
)


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    case=st.one_of(st.just(CASE), CASES),
    owner=st.one_of(st.just("ana"), TEXTS),
    reason=st.one_of(st.just("down"), TEXTS),
    expires_at=st.one_of(st.sampled_from([later(days=1), later(days=89)]), ENDS),
)
def test_any_body_is_stored_or_refused_never_5xx(
    shop: TestClient, case: Any, owner: str, reason: str, expires_at: Any
) -> None:
    sent = {"case": case, "owner": owner, "reason": reason, "expires_at": expires_at}
    r = shop.post(URL, json=sent)
    assert r.status_code in (200, 201, 422), r.text
    if r.status_code == 422:
        assert set(r.json()) == {"error", "detail", "problems"}
        return
    answer = r.json()
    assert (answer["case"], answer["owner"], answer["reason"]) == (CASE, owner, reason)
    ends = datetime.fromisoformat(answer["expires_at"])
    assert utcnow() < ends <= utcnow() + timedelta(days=90)


# -- the verdict rule ----------------------------------------------------------------------


def test_an_admin_sets_the_verdict_rule_audited(client: TestClient) -> None:
    assert client.post("/v1/projects", json={"name": "shop"}).status_code == 201
    url = "/v1/projects/shop/verdict-rule"
    assert client.get(url).json() == {"project": "shop", "verdict_rule": "threshold"}
    r = client.put(url, json={"verdict_rule": "wilson"})
    assert (r.status_code, r.json()) == (200, {"project": "shop", "verdict_rule": "wilson"})
    assert client.get(url).json()["verdict_rule"] == "wilson"
    assert (
        client.patch("/v1/projects/shop", json={"retention_days": 9}).json()["verdict_rule"]
        == "wilson"
    )
    for bad in ({"verdict_rule": "majority"}, {"verdict_rule": None}, {}, {"rule": "wilson"},
                {"verdict_rule": "wilson", "x": 1}):  # fmt: skip
        r = client.put(url, json=bad)
        assert r.status_code == 422, r.text
        assert set(r.json()) == {"error", "detail", "problems"}
    assert client.put(url, json={"verdict_rule": "threshold"}).status_code == 200
    events = client.get("/v1/audit", params={"action": "project.verdict_rule_set"}).json()
    assert [e["detail"] for e in reversed(events["items"])] == [
        {"project": "shop", "verdict_rule": ["threshold", "wilson"]},
        {"project": "shop", "verdict_rule": ["wilson", "threshold"]},
    ]
    reader = as_token(client, project_token(client, "shop", ["read", "submit"]))
    assert reader.get(url).status_code == 403
    assert reader.put(url, json={"verdict_rule": "wilson"}).status_code == 403
    stranger = as_token(client, project_token(client, "other", ["admin"]))
    assert stranger.put(url, json={"verdict_rule": "wilson"}).status_code == 404
    assert client.get(url).json()["verdict_rule"] == "threshold"


# -- gate admin ----------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_gate_admin_sets_lists_and_clears_quarantines_and_the_verdict_rule(
    live_server: tuple[str, int],  # noqa: F811
    sessions: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "http://{}:{}".format(*live_server)
    monkeypatch.setenv("GATE_TOKEN", ADMIN_TOKEN)
    assert run(capsys, "admin", "--url", url, "project-create", "shop")[0] == 0
    seed_case(sessions, "shop")
    who = ["--suite", CASE["suite"], "--agent", CASE["agent_name"], "--test", CASE["test_name"]]
    why = ["--owner", "ana", "--reason", "vendor down"]
    code, out, err = run(capsys, "admin", "--url", url, "quarantine-set", "shop", *who, *why,
                         "--days", "3")  # fmt: skip
    assert code == 0, err
    made = json.loads(out)
    assert (made["case"], made["owner"], made["active"]) == (CASE, "ana", True)
    ends = datetime.fromisoformat(made["expires_at"])
    assert timedelta(days=2, hours=23) < ends - utcnow() <= timedelta(days=3)

    code, out, _ = run(capsys, "admin", "--url", url, "quarantine-list", "shop")
    assert code == 0 and [q["id"] for q in json.loads(out)["items"]] == [made["id"]]
    # What the API refuses comes back as exit 2 with its reason.
    code, _, err = run(capsys, "admin", "--url", url, "quarantine-set", "shop", *who, *why,
                       "--days", "365")  # fmt: skip
    assert code == 2 and "422 RequestInvalid" in err and "GATE_MAX_QUARANTINE_DAYS" in err
    code, _, err = run(capsys, "admin", "--url", url, "quarantine-set", "shop", *who, *why,
                       "--expires-at", "2001-01-01T00:00:00")  # fmt: skip
    assert code == 2 and "is not in the future" in err
    code, _, err = run(capsys, "admin", "--url", url, "quarantine-set", "shop", *who, *why)
    assert code == 2 and "--expires-at or --days" in err

    code, out, _ = run(capsys, "admin", "--url", url, "quarantine-clear", "shop", made["id"])
    assert code == 0 and json.loads(out)["id"] == made["id"]
    code, _, err = run(capsys, "admin", "--url", url, "quarantine-clear", "shop", made["id"])
    assert code == 2 and "404" in err

    code, out, _ = run(capsys, "admin", "--url", url, "verdict-rule-set", "shop", "wilson")
    assert code == 0 and json.loads(out) == {"project": "shop", "verdict_rule": "wilson"}
    code, out, _ = run(capsys, "admin", "--url", url, "verdict-rule", "shop")
    assert code == 0 and json.loads(out)["verdict_rule"] == "wilson"
    code, _, _ = run(capsys, "admin", "--url", url, "verdict-rule-set", "shop", "majority")
    assert code == 2

    with session_scope(sessions) as s:
        actions = s.scalars(
            select(AuditEvent.action)
            .where(AuditEvent.action.like("case.%"))
            .order_by(AuditEvent.id)
        ).all()
    assert actions == ["case.quarantined", "case.quarantine_cleared"]

"""Baselines on a real Postgres (issue 44): the worker's comparison with a baseline gate,
quarantines, flakiness and incremental gates, through the API and the worker (the fake
sandbox runs the real runner in-process), and the rules on case rows written directly."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.baselines import judging
from gate_service.baselines.closure import case_key
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.gates import lifecycle
from gate_service.models import (
    Bundle,
    Case,
    CaseQuarantine,
    Gate,
    GateStatus,
    ModelCall,
    Project,
    utcnow,
)
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.baseline_projects import write_answerer
from tests.fixtures.projects import bundle_of
from tests.fixtures.sandbox import FakeSandbox
from tests.integration.test_ui_pages import browser, sign_in


def submit(client: TestClient, bundle: bytes, **fields: str) -> str:
    answer = client.post("/v1/gates", files={"bundle": ("b.tgz", bundle)}, data=fields)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def judged(client: TestClient, worker: Worker, gate_id: str) -> dict[str, Any]:
    assert worker.run_once() is True
    gate: dict[str, Any] = client.get(f"/v1/gates/{gate_id}").json()
    assert gate["phase"] == "done", gate
    return gate


def test_a_regression_fails_the_gate_where_the_threshold_held(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    counters = str(tmp_path)
    main_id = submit(
        client,
        bundle_of(write_answerer(tmp_path / "main", 10, counter_dir=counters)),
        labels='{"branch": "main"}',
    )
    main = judged(client, worker, main_id)
    assert main["status"] == "passed"
    change_id = submit(
        client,
        bundle_of(write_answerer(tmp_path / "change", 3, counter_dir=counters)),
        baseline="label:branch=main",
    )
    change = judged(client, worker, change_id)
    (case,) = change["cases"]
    assert (case["status"], case["successes"], case["invocations_run"]) == ("passed", 3, 10)
    assert case["regression_level"] == "regression"
    assert case["baseline"]["comparable"] is True
    assert case["baseline"]["p_value"] == pytest.approx(0.001548, abs=1e-6)
    assert change["status"] == "failed"
    assert "10/10 (100%) then, 3/10 (30%) now" in change["failure_reason"]
    assert "p = 0.001548" in change["failure_reason"]


def test_without_a_baseline_the_same_drop_passes(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    """The control: nothing but the baseline decides the failure above."""
    counters = str(tmp_path)
    main_id = submit(
        client,
        bundle_of(write_answerer(tmp_path / "main", 10, counter_dir=counters)),
        labels='{"branch": "main"}',
    )
    assert judged(client, worker, main_id)["status"] == "passed"
    gate_id = submit(
        client, bundle_of(write_answerer(tmp_path / "change", 3, counter_dir=counters))
    )
    gate = judged(client, worker, gate_id)
    assert gate["status"] == "passed"
    assert gate["cases"][0]["regression_level"] is None


def test_a_label_with_no_passing_gate_yet_compares_nothing_and_says_so(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    gate_id = submit(
        client,
        bundle_of(write_answerer(tmp_path / "p", 10, counter_dir=str(tmp_path))),
        baseline="label:branch=main",
    )
    gate = judged(client, worker, gate_id)
    assert gate["status"] == "passed"
    assert gate["baseline_gate_id"] is None
    (note,) = [w for w in gate["warnings"] if w["key"] == "baseline"]
    assert "no passing gate labelled branch=main yet" in note["message"]
    assert gate["cases"][0]["baseline"] is None


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"baseline": "main"}, "neither a gate id nor label:key=value"),
        ({"baseline": "label:branch"}, "must look like label:key=value"),
        ({"baseline": "x" * 301}, "at most 300 characters"),
        ({"changed_only": "true"}, "changed_only needs a baseline"),
        ({"changed_only": "yes", "baseline": "label:a=b"}, "must be true or false"),
        (
            {"changed_only": "true", "baseline": "label:a=b", "model_mode": "live"},
            "never reuses a live case",
        ),
    ],
)
def test_a_bad_baseline_is_refused_at_submission(
    client: TestClient, tmp_path: Path, fields: dict[str, str], said: str
) -> None:
    bundle = bundle_of(write_answerer(tmp_path / "p", 10))
    answer = client.post("/v1/gates", files={"bundle": ("b.tgz", bundle)}, data=fields)
    assert answer.status_code == 400, answer.text
    assert said in answer.json()["detail"]


def test_changed_only_reuses_an_unchanged_passing_case_and_runs_a_changed_one(
    client: TestClient, worker: Worker, sandbox: FakeSandbox, tmp_path: Path
) -> None:
    project = write_answerer(tmp_path / "p", 10, counter_dir=str(tmp_path))
    main = judged(client, worker, submit(client, bundle_of(project), labels='{"branch": "main"}'))
    assert main["status"] == "passed"
    runs_before = len(sandbox.runs)
    again = judged(
        client,
        worker,
        submit(client, bundle_of(project), baseline="label:branch=main", changed_only="true"),
    )
    (case,) = again["cases"]
    assert len(sandbox.runs) == runs_before  # not run again
    assert case["status"] == "passed"
    assert case["reused_from"] == main["cases"][0]["id"]
    assert "reused from baseline gate" in case["baseline"]["why"]
    (note,) = [w for w in again["warnings"] if w["key"] == "baseline.reused"]
    assert "1 of 1 case(s) reused" in note["message"]
    # A changed tool changes the closure: the case runs.
    tool = project / "tools" / "answer.py"
    tool.write_text(tool.read_text() + "\n# changed\n")
    changed = judged(
        client,
        worker,
        submit(client, bundle_of(project), baseline="label:branch=main", changed_only="true"),
    )
    assert len(sandbox.runs) == runs_before + 1
    assert changed["cases"][0]["reused_from"] is None
    (note,) = [w for w in changed["warnings"] if w["key"] == "baseline.reused"]
    assert "1 its closure changed since the baseline" in note["message"]


# The rules on rows written directly: a project, gates in order, cases with their counts.


class Rows:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.sha = uuid.uuid4().hex * 2
        with session_scope(sessions) as s:
            project = Project(name=f"p{uuid.uuid4().hex[:8]}")
            s.add(project)
            s.add(
                Bundle(
                    sha256=self.sha,
                    archive_format="tar.gz",
                    size_bytes=1,
                    code_bytes=1,
                    fixture_bytes=0,
                )
            )
            s.flush()
            self.project_id = project.id
        self.clock = utcnow() - timedelta(days=1)

    def gate(
        self,
        cases: list[tuple[str, int, int]],
        *,
        closure: str = "c1",
        definition: str = "d1",
        baseline: uuid.UUID | None = None,
        status: str = GateStatus.running,
    ) -> uuid.UUID:
        """A gate with one case per (test name, successes, runs), threshold 50%."""
        self.clock += timedelta(minutes=1)
        with session_scope(self.sessions) as s:
            gate = Gate(
                project_id=self.project_id,
                bundle_sha256=self.sha,
                status=status,
                phase="running_tests",
                labels={},
                problems=[],
                created_at=self.clock,
                baseline_gate_id=baseline,
                baseline=str(baseline) if baseline else None,
            )
            s.add(gate)
            s.flush()
            for position, (name, successes, runs) in enumerate(cases):
                passed = successes * 100 >= 50 * runs
                s.add(
                    Case(
                        gate_id=gate.id,
                        position=position,
                        suite="tests/s.yaml",
                        agent_name="a",
                        test_name=name,
                        status="passed" if passed else "failed",
                        passed=passed,
                        successes=successes,
                        runs=runs,
                        invocations_run=runs,
                        success_threshold=50,
                        timeout_s=60,
                        failure_reason=None if passed else f"{name} failed",
                        case_key=case_key("tests/s.yaml", "a", name),
                        closure_hash=closure,
                        definition_hash=definition,
                    )
                )
            return gate.id

    def finish(self, gate_id: uuid.UUID, settings: Settings) -> tuple[Gate, list[Case]]:
        with session_scope(self.sessions) as s:
            gate = lifecycle.get_gate(s, gate_id, for_update=True)
            warnings = judging.annotate_cases(s, gate, settings)
            gate.warnings = warnings
            lifecycle.finish_gate(s, gate)
            cases = list(s.query(Case).filter(Case.gate_id == gate_id).order_by(Case.position))
            s.expunge_all()
            return gate, cases


@pytest.fixture
def rows(sessions: sessionmaker[Session]) -> Rows:
    return Rows(sessions)


def finished(rows: Rows, settings: Settings, gate_id: uuid.UUID) -> None:
    with session_scope(rows.sessions) as s:
        s.get_one(Gate, gate_id).status = GateStatus.passed


def test_a_likely_regression_warns_and_passes(rows: Rows, settings: Settings) -> None:
    base = rows.gate([("t", 9, 10)])
    finished(rows, settings, base)
    gate, (case,) = rows.finish(rows.gate([("t", 6, 10)], baseline=base), settings)
    # p = 0.1517 (scipy), a drop of 30 points: under 0.20, over 15: likely, not regression.
    assert case.regression_level == "likely"
    assert case.baseline is not None and case.baseline["p_value"] == pytest.approx(0.151703)
    assert gate.status == GateStatus.passed
    (warning,) = gate.warnings
    assert warning["key"] == "baseline.likely_regression"
    assert "a::t 9/10 then, 6/10 now (p = 0.1517)" in warning["message"]


def test_cases_new_or_changed_since_the_baseline_are_not_compared(
    rows: Rows, settings: Settings
) -> None:
    base = rows.gate([("same", 10, 10), ("changed", 10, 10)])
    finished(rows, settings, base)
    gate_id = rows.gate([("same", 10, 10), ("new", 0, 10)], baseline=base)
    with session_scope(rows.sessions) as s:  # "changed": its own YAML is another now
        s.add(
            Case(
                gate_id=gate_id,
                position=2,
                suite="tests/s.yaml",
                agent_name="a",
                test_name="changed",
                status="passed",
                passed=True,
                successes=5,
                runs=10,
                success_threshold=50,
                timeout_s=60,
                case_key=case_key("tests/s.yaml", "a", "changed"),
                closure_hash="c2",
                definition_hash="d2",
            )
        )
    gate, cases = rows.finish(gate_id, settings)
    by_name = {c.test_name: c for c in cases}
    assert by_name["same"].regression_level == "none"
    assert by_name["new"].baseline is not None
    assert by_name["new"].baseline["comparable"] is False
    assert "new since the baseline" in by_name["new"].baseline["why"]
    assert by_name["changed"].baseline is not None
    assert "own YAML changed" in by_name["changed"].baseline["why"]
    assert by_name["changed"].regression_level is None  # 10/10 -> 5/10, never compared
    assert gate.status == GateStatus.failed  # "new" failed its own threshold, nothing else
    assert "regressed" not in (gate.failure_reason or "")


def test_a_quarantined_failure_is_reported_and_does_not_fail_the_gate(
    rows: Rows, settings: Settings
) -> None:
    with session_scope(rows.sessions) as s:
        for name, days in (("held", 3), ("lapsed", -1)):
            s.add(
                CaseQuarantine(
                    project_id=rows.project_id,
                    case_key=case_key("tests/s.yaml", "a", name),
                    suite="tests/s.yaml",
                    agent_name="a",
                    test_name=name,
                    owner="dana",
                    reason="model upgrade in flight",
                    expires_at=utcnow() + timedelta(days=days),
                )
            )
    gate, cases = rows.finish(rows.gate([("held", 0, 2), ("fine", 2, 2)]), settings)
    assert gate.status == GateStatus.passed
    assert cases[0].status == "failed"
    assert cases[0].quarantine is not None and cases[0].quarantine["owner"] == "dana"
    # An expired quarantine excuses nothing.
    gate, cases = rows.finish(rows.gate([("lapsed", 0, 2)]), settings)
    assert gate.status == GateStatus.failed
    assert cases[0].quarantine is None


def test_a_case_whose_verdicts_differ_under_one_closure_is_flaky_until_k_passes(
    rows: Rows, settings: Settings
) -> None:
    rows.gate([("t", 2, 2)])
    rows.gate([("t", 0, 2)])
    _, (case,) = rows.finish(rows.gate([("t", 2, 2)]), settings)
    assert case.flaky is not None
    assert (case.flaky["gates"], case.flaky["passed_gates"]) == (3, 2)
    assert (case.flaky["successes"], case.flaky["runs"]) == (4, 6)
    # Another closure is another history: not flaky.
    _, (other,) = rows.finish(rows.gate([("t", 2, 2)], closure="c9"), settings)
    assert other.flaky is None
    # Clears after GATE_FLAKY_CLEAR_PASSES (5) consecutive passes, counting its own.
    for _ in range(3):
        rows.gate([("t", 2, 2)])
    _, (fifth,) = rows.finish(rows.gate([("t", 2, 2)]), settings)
    assert fifth.flaky is None


def test_the_label_baseline_is_the_last_passing_older_gate_of_the_project(
    rows: Rows, settings: Settings, sessions: sessionmaker[Session]
) -> None:
    with session_scope(sessions) as s:

        def labelled(status: str, minutes: int, project: uuid.UUID) -> uuid.UUID:
            gate = Gate(
                project_id=project,
                bundle_sha256=rows.sha,
                status=status,
                phase="done",
                labels={"branch": "main", "commit": str(minutes)},
                problems=[],
                created_at=rows.clock + timedelta(minutes=minutes),
            )
            s.add(gate)
            s.flush()
            return gate.id

        other = Project(name=f"o{uuid.uuid4().hex[:8]}")
        s.add(other)
        s.flush()
        wanted = labelled("passed", 1, rows.project_id)
        labelled("failed", 2, rows.project_id)  # newer, but failed
        labelled("passed", 3, other.id)  # newer, but another project's
        asking = Gate(
            project_id=rows.project_id,
            bundle_sha256=rows.sha,
            status="running",
            phase="validating",
            labels={},
            problems=[],
            baseline="label:branch=main",
            created_at=rows.clock + timedelta(minutes=4),
        )
        s.add(asking)
        s.flush()
        labelled("passed", 5, rows.project_id)  # passed, but after the gate was submitted
        assert judging.resolve_baseline(s, asking) == (wanted, None)
        asking.baseline = str(uuid.uuid4())
        found, why = judging.resolve_baseline(s, asking)
        assert found is None and why is not None and "not a gate of this project" in why


def test_a_wilson_project_runs_a_case_until_its_interval_decides(
    client: TestClient, worker: Worker, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    with session_scope(sessions) as s:
        s.query(Project).filter(Project.name == "default").update({"verdict_rule": "wilson"})
    suite = """
        tests:
          - name: answers_most_of_the_time
            payload: '{"n": 1}'
            runs: 5
            success_threshold: 70
            expected_result: output.ok == True
    """
    bundle = bundle_of(write_answerer(tmp_path / "p", 10, counter_dir=str(tmp_path), suite=suite))
    gate = judged(client, worker, submit(client, bundle))
    (case,) = gate["cases"]
    # 5 of 5 is 56.6-100%, which holds 70%; 9 of 9 (70.1-100%) clears it.
    assert (case["status"], case["successes"], case["runs"]) == ("passed", 9, 5)
    assert (case["invocations_run"], case["stopped_early"]) == (9, False)
    assert gate["status"] == "passed"


def test_a_case_page_shows_its_history_oldest_first_marking_a_changed_closure(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    project = write_answerer(tmp_path / "p", 10, counter_dir=str(tmp_path))
    first = judged(client, worker, submit(client, bundle_of(project)))
    second = judged(client, worker, submit(client, bundle_of(project)))
    tool = project / "tools" / "answer.py"
    tool.write_text(tool.read_text() + "\n# changed\n")
    third = judged(client, worker, submit(client, bundle_of(project)))
    page = browser(client)
    sign_in(page, ADMIN_TOKEN)
    html = page.get(f"/ui/cases/{third['cases'][0]['id']}").text
    rows = re.findall(
        r"<tr(?: aria-current=\"true\" class=\"current\")?>\s*<th scope=\"row\"><a href=\"/ui/gates/([0-9a-f-]+)\">(.*?)</tr>",
        html,
        re.S,
    )
    assert [gate for gate, _ in rows] == [first["id"], second["id"], third["id"]]
    marked = ["closure changed" in body for _, body in rows]
    assert marked == [False, False, True]  # the tool changed before the third gate
    assert 'aria-current="true"' in html


def add_call(
    sessions: sessionmaker[Session], gate_id: uuid.UUID, status: str, **error: Any
) -> None:
    """A model call of the gate's first case, as the gateway would have stored it."""
    with session_scope(sessions) as s:
        case = s.query(Case).filter(Case.gate_id == gate_id, Case.position == 0).one()
        s.add(
            ModelCall(
                gate_id=gate_id,
                case_id=case.id,
                position=0,
                agent="a",
                model="openai/gpt-4o",
                request_hash="0" * 64,
                status=status,
                error={"kind": status, "message": "x", **error} if status != "ok" else None,
            )
        )


@pytest.mark.parametrize(
    ("status", "error", "comparable"),
    [
        ("rate_limited", {"provider_status": 429}, False),
        ("unreachable", {}, False),
        ("provider", {"provider_status": 503}, False),
        ("provider", {"provider_status": 400}, True),  # the request itself: the agent's
        ("ok", {}, True),
    ],
)
def test_a_model_call_failed_outside_the_agent_makes_a_case_not_comparable(
    rows: Rows, settings: Settings, status: str, error: dict[str, Any], comparable: bool
) -> None:
    """20/20 then, 14/20 now with 6 rate limits: the drop is the provider's, not a regression."""
    base = rows.gate([("t", 20, 20)])
    finished(rows, settings, base)
    gate_id = rows.gate([("t", 14, 20)], baseline=base)
    add_call(rows.sessions, gate_id, status, **error)
    gate, (case,) = rows.finish(gate_id, settings)
    assert case.baseline is not None and case.baseline["comparable"] is comparable
    if comparable:
        assert case.regression_level == "regression" and gate.status == GateStatus.failed
    else:
        assert "failed outside the agent" in case.baseline["why"]
        assert case.regression_level is None and gate.status == GateStatus.passed


def test_a_baseline_case_that_called_out_or_was_flaky_is_not_reused(
    rows: Rows, sessions: sessionmaker[Session]
) -> None:
    base = rows.gate([("called", 2, 2), ("flaky", 2, 2), ("quiet", 2, 2)])
    add_call(sessions, base, "ok")
    with session_scope(sessions) as s:
        s.query(Case).filter(Case.gate_id == base, Case.test_name == "flaky").update(
            {"flaky": {"gates": 3, "passed_gates": 2, "successes": 4, "runs": 6}}
        )
        s.query(Case).filter(Case.gate_id == base).update({"status": "passed"})
    gate_id = rows.gate([("called", 2, 2), ("flaky", 2, 2), ("quiet", 2, 2)], baseline=base)
    with session_scope(sessions) as s:
        s.query(Case).filter(Case.gate_id == gate_id).update({"status": "queued"})
        gate = s.get_one(Gate, gate_id)
        gate.changed_only = True
        reuses, not_reused, already = judging.reusable_cases(s, gate, lambda agent: None)
        assert [r.case.test_name for r in reuses] == ["quiet"]
        assert not_reused == {
            "not deterministic: it called out through the model gateway in the baseline": 1,
            "flaky in the baseline": 1,
        }
        assert already == 0

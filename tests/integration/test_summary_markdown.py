"""GET /v1/gates/{id}/summary.md and the pages with baselines, on a real Postgres (no worker:
the cases are given what the worker would store). The Markdown and the pages read a gate
through gates.views, as GET /v1/gates/{id} does; tests/unit/test_markdown_summary.py holds the
builder itself to its escaping."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gate_service.bundles.suites import CaseRef
from gate_service.client.api import GateClient
from gate_service.config import Settings
from gate_service.gates import lifecycle
from gate_service.main import create_app
from gate_service.models import CaseStatus, Gate
from tests.fixtures.auth import ADMIN_TOKEN, as_token, bearer, project_token
from tests.fixtures.projects import bundle_of, calculator_project
from tests.integration.test_case_pages import Through
from tests.integration.test_ui_pages import browser, sign_in

HOSTILE = "evil | </td><script>alert(1)</script>\n| x | y | @octocat `code`"
QUARANTINE = {
    "owner": "ana",
    "reason": "upstream <b>flake</b>",
    "expires_at": (datetime.now(UTC) + timedelta(days=30)).isoformat(),
}


def judged_gate(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> tuple[str, str, dict[str, str]]:
    """A failed gate compared with a baseline gate: a regressed case (its threshold held), a
    quarantined failure with a hostile name, a likely regression and a plain pass. Returns
    the gate's id, the baseline gate's and the case ids by name."""
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    base_id = client.post("/v1/gates", files={"bundle": ("b.tgz", data)}).json()["id"]
    gate_id = client.post("/v1/gates", files={"bundle": ("p.tgz", data)}).json()["id"]
    with sessions.begin() as session:
        gate = session.get_one(Gate, uuid.UUID(gate_id))
        names = ["dropped", HOSTILE, "wobbly", "fine"]
        # A threshold of 10%: 3 of 10 holds it, and its interval (10.8-60.3%) is not narrow.
        refs = [CaseRef("tests/calc.yaml", "calc", name, 10, 10, 60) for name in names]
        dropped, hostile, wobbly, fine = lifecycle.save_cases(session, gate, refs)
        for case, successes in ((dropped, 3), (hostile, 0), (wobbly, 8), (fine, 10)):
            case.successes = successes
            case.passed = successes >= 1
            case.status = CaseStatus.passed if case.passed else CaseStatus.failed
        hostile.failure_reason = "0/10 runs passed"
        hostile.quarantine = QUARANTINE
        for case, p_value, level in ((dropped, 0.0015, "regression"), (wobbly, 0.237, "likely")):
            case.baseline = {
                "gate_id": base_id,
                "case_id": str(uuid.uuid4()),
                "successes": 10,
                "runs": 10,
                "comparable": True,
                "why": None,
                "p_value": p_value,
                "drop_points": 70.0,
            }
            case.regression_level = level
        gate.status, gate.phase = "failed", "done"
        gate.failure_reason = "1 case(s) regressed against the baseline"
        gate.baseline, gate.baseline_gate_id = "label:branch=main", uuid.UUID(base_id)
        gate.revision += 1
        ids = {c.test_name: str(c.id) for c in (dropped, hostile, wobbly, fine)}
    return gate_id, base_id, ids


def test_the_summary_is_markdown_of_the_cases_that_need_a_look(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id, base_id, ids = judged_gate(client, sessions, tmp_path)
    answer = client.get(f"/v1/gates/{gate_id}/summary.md")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "text/markdown; charset=utf-8"
    assert answer.headers["x-content-type-options"] == "nosniff"
    text = answer.text
    assert text.startswith("### ❌ Deploy gate failed\n\n4 cases: 3 passed, 1 failed.")
    assert f"[`{base_id[:8]}`](/ui/gates/{base_id})" in text
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    assert len(rows) == 3  # the failed (quarantined), the regressed, the likely: not "fine"
    quarantined, regressed, likely = rows
    assert regressed == (
        f"| [calc\\:\\:dropped](/ui/cases/{ids['dropped']}) | regression | 3/10 (30%) "
        "| 10.8-60.3% | 10/10 (100%) | 0.0015 |"
    )
    assert "| likely regression | 8/10 (80%) |" in likely
    assert "failed, quarantined (ana, until " in quarantined
    # The hostile name is one cell of one line: no pipe, tag or mention of its own.
    assert "evil \\| &lt;\\/td&gt;&lt;script&gt;" in quarantined
    assert "@&#8203;octocat" in quarantined
    assert "<script>" not in text and "\n| x | y" not in text
    assert f"(/ui/cases/{ids[HOSTILE]})" in quarantined


def test_links_are_absolute_under_gate_public_url_and_the_client_makes_paths_absolute(
    client: TestClient, settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id, _, ids = judged_gate(client, sessions, tmp_path)
    public = settings.model_copy(update={"public_url": "https://gate.example.com"})
    with TestClient(create_app(public), headers=bearer(ADMIN_TOKEN)) as other:
        text = other.get(f"/v1/gates/{gate_id}/summary.md").text
    assert f"(https://gate.example.com/ui/cases/{ids['dropped']})" in text
    assert f"[Results](https://gate.example.com/ui/gates/{gate_id})" in text
    api = GateClient("http://testserver", transport=Through(client))
    try:
        fetched = api.summary_markdown(gate_id)
    finally:
        api.close()
    assert f"(http://testserver/ui/cases/{ids['dropped']})" in fetched
    assert "](/ui/" not in fetched


def test_the_summary_needs_a_reader_of_the_gates_project(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id, _, _ = judged_gate(client, sessions, tmp_path)
    path = f"/v1/gates/{gate_id}/summary.md"
    assert as_token(client, None).get(path).status_code == 401
    other = as_token(client, project_token(client, "other", ["read"]))
    refused = other.get(path)
    assert refused.status_code == 404 and refused.json()["error"] == "NotFound"
    assert other.get(f"/v1/gates/{uuid.uuid4()}/summary.md").status_code == 404
    writer = as_token(client, project_token(client, "default", ["submit"]))
    assert writer.get(path).status_code == 403


def test_the_pages_show_the_baseline_quarantine_and_notes_of_each_case(
    client: TestClient, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    gate_id, base_id, ids = judged_gate(client, sessions, tmp_path)
    page = browser(client)
    sign_in(page, ADMIN_TOKEN)
    html = page.get(f"/ui/gates/{gate_id}").text
    assert f'<a href="/ui/gates/{base_id}"><code>{base_id[:8]}</code></a>' in html
    assert '<th scope="col">Baseline</th>' in html
    assert ">REGRESSION</span>" in html and ">LIKELY</span>" in html and "p = 0.0015" in html
    assert "QUARANTINED" in html
    assert "regressed against baseline gate" in html and "this fails the gate" in html
    assert "quarantined by ana until" in html and "upstream &lt;b&gt;flake&lt;/b&gt;" in html
    assert "95%: 10.8-60.3%" in html
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    case_page = page.get(f"/ui/cases/{ids['dropped']}").text
    assert "<h2>Notes</h2>" in case_page
    assert re.search(r"regressed against baseline gate \w{8}: 10/10 \(100%\) then", case_page)
    assert f'<a href="/ui/gates/{base_id}">' in case_page

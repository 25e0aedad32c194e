"""The results pages on a real Postgres (issue 22): html_url, sign-in sessions and what they
refuse, each page's content, and the escaping of a bundle's hostile text. The worker is the
fake-sandbox one (the real runner, in-process); tests/e2e/test_results_pages.py drives the
same pages in Chromium against a real engine."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gate_service.client.junit import junit_xml
from gate_service.config import Settings
from gate_service.db import session_scope
from gate_service.main import create_app
from gate_service.models import ApiToken, Case, Run, UiSession, utcnow
from gate_service.ui.routes import safe_next
from gate_service.ui.views import MAX_TRACE_DEPTH
from gate_service.worker.loop import Worker
from tests.fixtures.auth import ADMIN_TOKEN, bearer, project_token
from tests.fixtures.projects import bundle_of, results_page_project

CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


def submit(client: TestClient, tmp_path: Path, token: str = ADMIN_TOKEN) -> str:
    data = bundle_of(results_page_project(tmp_path / uuid.uuid4().hex))
    answer = client.post("/v1/gates", files={"bundle": ("b.tgz", data)}, headers=bearer(token))
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


ORIGIN = {"Origin": "http://testserver"}


def browser(client: TestClient) -> TestClient:
    """A client of the same app with no bearer header: a browser, cookies only, whose forms
    carry the Origin of the pages they were on (as browsers send it)."""
    return TestClient(client.app, follow_redirects=False, headers=ORIGIN)


def sign_in(page: TestClient, token: str, next_path: str = "/ui") -> str:
    answer = page.post("/ui/sign-in", data={"token": token, "next": next_path})
    assert answer.status_code == 303, answer.text
    return answer.headers["location"]


@pytest.fixture
def failed_gate(client: TestClient, worker: Worker, tmp_path: Path) -> str:
    gate_id = submit(client, tmp_path)
    assert worker.run_once() is True
    assert client.get(f"/v1/gates/{gate_id}").json()["status"] == "failed"
    return gate_id


def test_html_url_is_a_path_by_default_and_absolute_under_gate_public_url(
    client: TestClient, settings: Settings, failed_gate: str
) -> None:
    gate = client.get(f"/v1/gates/{failed_gate}").json()
    assert gate["html_url"] == f"/ui/gates/{failed_gate}"
    listed = client.get("/v1/gates").json()["items"][0]
    assert listed["html_url"] == f"/ui/gates/{failed_gate}"
    public = settings.model_copy(update={"public_url": "https://gate.example.com"})
    with TestClient(create_app(public), headers=bearer(ADMIN_TOKEN)) as other:
        gate = other.get(f"/v1/gates/{failed_gate}").json()
    assert gate["html_url"] == f"https://gate.example.com/ui/gates/{failed_gate}"
    # The JUnit file names the page too, where a CI's test report shows it.
    assert f'name="gate.html_url" value="https://gate.example.com/ui/gates/{failed_gate}"' in (
        junit_xml(gate).decode()
    )


@pytest.mark.parametrize(
    "bad", ["ftp://gate", "https://gate/?x=1", "gate.example.com", "https://gate/prefix"]
)
def test_gate_public_url_must_be_an_http_url(bad: str) -> None:
    with pytest.raises(ValueError, match="GATE_PUBLIC_URL"):
        Settings(public_url=bad)


def test_a_page_without_a_session_goes_to_the_form_and_comes_back(
    client: TestClient, failed_gate: str
) -> None:
    page = browser(client)
    answer = page.get(f"/ui/gates/{failed_gate}")
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/ui/sign-in?next=%2Fui%2Fgates%2F{failed_gate}"
    form = page.get(answer.headers["location"])
    assert 'name="token"' in form.text and f'value="/ui/gates/{failed_gate}"' in form.text
    # Reached from another site's link (no Strict cookie yet), the form reloads itself once.
    bounce = f"/ui/sign-in?next=%2Fui%2Fgates%2F{failed_gate}&amp;checked=1"
    assert f'http-equiv="refresh" content="0; url={bounce}"' in form.text
    assert "http-equiv" not in page.get("/ui/sign-in?next=/ui&checked=1").text
    assert sign_in(page, ADMIN_TOKEN, f"/ui/gates/{failed_gate}") == f"/ui/gates/{failed_gate}"
    cookie = page.cookies.jar
    (jar,) = list(cookie)
    # The cookie holds a random id, never the token; HttpOnly and SameSite=Strict.
    assert jar.name == "gate_session" and ADMIN_TOKEN not in (jar.value or "")
    assert jar.path == "/ui" and jar.has_nonstandard_attr("HttpOnly")
    assert jar.get_nonstandard_attr("SameSite", "").lower() == "strict"
    # Signed in, the form (as the bounce reaches it) goes straight on to the page.
    again = page.get(f"/ui/sign-in?next=/ui/gates/{failed_gate}&checked=1")
    assert (again.status_code, again.headers["location"]) == (303, f"/ui/gates/{failed_gate}")
    shown = page.get(f"/ui/gates/{failed_gate}")
    assert shown.status_code == 200
    assert "expects_the_wrong_plan" in shown.text and "answers_with_the_plan" in shown.text
    assert "Content-Security-Policy" in shown.headers


def test_sign_in_refuses_unknown_tokens_and_tokens_without_read(
    client: TestClient, settings: Settings
) -> None:
    page = browser(client)
    wrong = page.post("/ui/sign-in", data={"token": "gate_nope", "next": "/ui"})
    assert wrong.status_code == 401 and "the token is not known" in wrong.text
    submit_only = project_token(client, "ui-submit-only", ["submit"])
    refused = page.post("/ui/sign-in", data={"token": submit_only, "next": "/ui"})
    assert refused.status_code == 403 and "lacks the read scope" in refused.text
    assert "gate_session" not in page.cookies


@pytest.mark.parametrize(
    "target",
    ["//evil.example/ui", "https://evil.example/ui", "/ui\\@evil", "/v1/gates", "/uix", "ui"],
)
def test_sign_in_never_sends_a_person_off_the_pages(target: str) -> None:
    assert safe_next(target) == "/ui"


def test_another_projects_gate_case_and_run_answer_404(
    client: TestClient, failed_gate: str, sessions: sessionmaker[Session]
) -> None:
    with session_scope(sessions) as s:
        case_id = s.scalars(select(Case.id).where(Case.gate_id == uuid.UUID(failed_gate))).first()
        run_id = s.scalars(select(Run.id).where(Run.case_id == case_id)).first()
    page = browser(client)
    sign_in(page, project_token(client, "ui-other", ["read"]))
    for path in (f"/ui/gates/{failed_gate}", f"/ui/cases/{case_id}", f"/ui/runs/{run_id}"):
        answer = page.get(path)
        assert answer.status_code == 404, path
        assert "Not found" in answer.text and "text/html" in answer.headers["content-type"]
    assert failed_gate not in page.get("/ui").text


def test_forms_that_change_state_need_the_session_form_token_and_our_origin(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    gate_id = submit(client, tmp_path)  # queued: cancellable
    page = browser(client)
    sign_in(page, ADMIN_TOKEN)
    shown = page.get(f"/ui/gates/{gate_id}").text
    token = CSRF.search(shown)
    assert token is not None and "Cancel this gate" in shown
    forged = page.post(f"/ui/gates/{gate_id}/cancel", data={"csrf": "0" * 64})
    assert forged.status_code == 403
    other_site = page.post(
        f"/ui/gates/{gate_id}/cancel",
        data={"csrf": token.group(1)},
        headers={"Origin": "https://evil.example"},
    )
    assert other_site.status_code == 403
    assert client.get(f"/v1/gates/{gate_id}").json()["status"] == "queued"
    done = page.post(f"/ui/gates/{gate_id}/cancel", data={"csrf": token.group(1)})
    assert done.status_code == 303
    assert client.get(f"/v1/gates/{gate_id}").json()["status"] == "cancelled"
    # Sign-out is a form too: without the token it is refused, with it the session ends.
    assert page.post("/ui/sign-out", data={}).status_code == 403
    # A form with neither Origin nor Referer is not one of our pages'.
    bare = TestClient(client.app, follow_redirects=False, cookies=page.cookies)
    no_origin = bare.post("/ui/sign-out", data={"csrf": token.group(1)})
    assert no_origin.status_code == 403 and "no Origin or Referer" in no_origin.text
    # A Referer that is no URL at all is no origin either: 403, never a 500.
    broken = bare.post(
        "/ui/sign-in", data={"token": ADMIN_TOKEN}, headers={"Referer": "http://[::1"}
    )
    assert broken.status_code == 403 and "no Origin or Referer" in broken.text
    via_referer = bare.post(
        "/ui/sign-in",
        data={"token": ADMIN_TOKEN},
        headers={"Referer": "http://testserver/ui/sign-in"},
    )
    assert via_referer.status_code == 303
    out = page.post("/ui/sign-out", data={"csrf": token.group(1)})
    assert (out.status_code, out.headers["location"]) == (303, "/ui/sign-in")
    assert page.get("/ui").status_code == 303


def test_revoking_the_token_ends_its_sessions(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    token = project_token(client, "ui-revoked", ["read"])
    page = browser(client)
    sign_in(page, token)
    assert page.get("/ui").status_code == 200
    with session_scope(sessions) as s:
        s.execute(
            update(ApiToken)
            .where(ApiToken.id == select(UiSession.token_id).scalar_subquery())
            .values(revoked_at=utcnow())
        )
    assert page.get("/ui").status_code == 303


def test_the_pages_show_cases_failed_first_runs_and_a_mocked_tool_call(
    client: TestClient, failed_gate: str
) -> None:
    page = browser(client)
    sign_in(page, ADMIN_TOKEN)
    gate = page.get(f"/ui/gates/{failed_gate}").text
    assert gate.index("expects_the_wrong_plan") < gate.index("answers_with_the_plan")
    assert "FAIL" in gate and "PASS" in gate and "output.plan == &#34;enterprise&#34;" in gate
    case_id = re.search(r'href="/ui/cases/([0-9a-f-]{36})">expects_the_wrong_plan', gate)
    assert case_id is not None
    case = page.get(f"/ui/cases/{case_id.group(1)}").text
    assert "Invocations" in case and "which plan is Ada on" in case
    run_id = re.search(r'href="/ui/runs/([0-9a-f-]{36})"', case)
    assert run_id is not None
    run = page.get(f"/ui/runs/{run_id.group(1)}").text
    assert 'class="fact mocked">mocked<' in run and "lookup" in run
    assert "model call" in run and "Run context" in run
    # What ran it (issue 42): the gate's sandbox, on the gate, case and run pages alike.
    ran = "docker, its container under <code>in-process</code>"
    assert ran in case and ran in run
    assert "case containers under <code>in-process</code>" in gate
    assert client.get(f"/v1/gates/{failed_gate}").json()["sandbox"] == {
        "backend": "docker",
        "runtime": "in-process",
    }
    # And the run's own answer, so a pipeline reading one trace knows what ran it.
    assert client.get(f"/v1/runs/{run_id.group(1)}").json()["sandbox"] == {
        "backend": "docker",
        "runtime": "in-process",
    }


def test_a_bundles_text_is_escaped_and_a_hostile_trace_still_renders(
    client: TestClient, failed_gate: str, sessions: sessionmaker[Session]
) -> None:
    # Spans nested 5,000 deep, a cycle, and markup everywhere: what a bundle's code can make.
    deep = [
        {
            "span_id": f"d{i}",
            "parent_span_id": f"d{i - 1}" if i else None,
            "span_order": i,
            "type": "agent",
            "name": f"<script>alert({i})</script>",
            "status": "ok",
            "duration_ms": 1,
            "metadata": {"note": "<img src=x onerror=alert(1)>"},
        }
        for i in range(5000)
    ]
    cycle = [
        {**deep[0], "span_id": "c1", "parent_span_id": "c2", "span_order": 6000},
        {**deep[0], "span_id": "c2", "parent_span_id": "c1", "span_order": 6001},
    ]
    with session_scope(sessions) as s:
        run = s.scalars(
            select(Run).join(Case).where(Case.gate_id == uuid.UUID(failed_gate))
        ).first()
        assert run is not None
        run.traces = deep + cycle
        run.shared_values = {}
        run.failure_reason = "<b>bold</b>"
        run_id = run.id
    page = browser(client)
    sign_in(page, ADMIN_TOKEN)
    shown = page.get(f"/ui/runs/{run_id}")
    assert shown.status_code == 200
    assert "<script>alert" not in shown.text and "<img src=x" not in shown.text
    assert "&lt;b&gt;bold&lt;/b&gt;" in shown.text
    # Every span shown, the cycle's two included, and nested no deeper than the page allows.
    assert shown.text.count("&lt;script&gt;alert(") == 5002
    depth = max_depth = 0
    for tag in re.findall(r"</?details", shown.text):
        depth += 1 if tag == "<details" else -1
        max_depth = max(max_depth, depth)
    assert max_depth == MAX_TRACE_DEPTH + 1  # the top span and MAX_TRACE_DEPTH levels below


def test_the_sign_in_form_is_braked_like_a_bearer_header(client: TestClient) -> None:
    page = browser(client)
    limit = client.app.state.gate.settings.auth_failure_limit  # type: ignore[attr-defined]
    for _ in range(limit):
        assert page.post("/ui/sign-in", data={"token": "gate_guess"}).status_code == 401
    braked = page.post("/ui/sign-in", data={"token": ADMIN_TOKEN})
    assert braked.status_code == 429 and "Retry-After" in braked.headers
    assert "too many failed authentications" in braked.text


def test_sign_in_returns_only_to_a_page_and_a_planted_cookie_is_no_session(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    page = browser(client)
    assert sign_in(page, ADMIN_TOKEN, "//evil.example/ui") == "/ui"
    # Signing in again ends the session the browser held: one row, not two.
    assert sign_in(page, ADMIN_TOKEN, "/ui") == "/ui"
    with session_scope(sessions) as s:
        assert len(s.scalars(select(UiSession)).all()) == 1
    # A sign-in posted from another site's page is refused before the token is looked at.
    forged = page.post(
        "/ui/sign-in", data={"token": ADMIN_TOKEN}, headers={"Origin": "https://evil.example"}
    )
    assert forged.status_code == 403 and "another site" in forged.text
    # A cookie value the service did not make (say, planted by another site) signs no one in.
    stranger = browser(client)
    stranger.cookies.set("gate_session", "x" * 43, path="/ui")
    assert stranger.get("/ui").status_code == 303


def test_an_expired_session_goes_back_to_the_form(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    page = browser(client)
    sign_in(page, ADMIN_TOKEN)
    assert page.get("/ui").status_code == 200
    with session_scope(sessions) as s:
        s.execute(update(UiSession).values(expires_at=utcnow()))
    assert page.get("/ui").status_code == 303


def test_pages_forbid_framing_and_any_script_but_their_own(client: TestClient) -> None:
    page = browser(client)
    form = page.get("/ui/sign-in")
    policy = form.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in policy and "script-src 'self';" in policy
    assert "unsafe-inline" not in policy
    assert form.headers["X-Content-Type-Options"] == "nosniff"
    # The connic CLI's link and the root lead to the pages.
    gate_id = uuid.uuid4()
    link = page.get(f"/projects/default/deployments/{gate_id}?env=default")
    assert (link.status_code, link.headers["location"]) == (303, f"/ui/gates/{gate_id}")
    assert page.get("/").headers["location"] == "/ui"


def test_a_running_gates_page_answers_304_until_it_changes(
    client: TestClient, worker: Worker, tmp_path: Path
) -> None:
    gate_id = submit(client, tmp_path)
    page = browser(client)
    sign_in(page, ADMIN_TOKEN)
    first = page.get(f"/ui/gates/{gate_id}?fragment=1")
    assert first.status_code == 200 and "<html" not in first.text
    assert 'data-status="queued"' in first.text
    etag = first.headers["ETag"]
    assert (
        page.get(f"/ui/gates/{gate_id}?fragment=1", headers={"If-None-Match": etag}).status_code
        == 304
    )
    assert worker.run_once() is True
    changed = page.get(f"/ui/gates/{gate_id}?fragment=1", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and 'data-status="failed"' in changed.text
    # Another session's ETag for the same revision is not this one's (its forms differ).
    other = browser(client)
    sign_in(other, ADMIN_TOKEN)
    assert other.get(f"/ui/gates/{gate_id}").headers["ETag"] != changed.headers["ETag"]

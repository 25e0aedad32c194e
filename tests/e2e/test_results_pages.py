"""The results pages in a real browser (issue 22): Debian's Chromium, driven by Playwright,
against `gate serve` with a real engine and Postgres, judging a real bundle.

One gate is submitted for the module and watched from its first moment: the first test sees
it running and turn `failed` without a reload; the others read the finished gate. The layout
(above the fold, 360 px, badges) and docs/results.md's screenshot are test_results_layout.py's.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.fixtures.auth import bearer
from tests.fixtures.browser import (
    expect,
    launched_chromium,
    serious_violations,
    sign_in,
    token_of,
)
from tests.fixtures.projects import bundle_of, results_page_project

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.docker

PROJECT, OTHER = "ui-e2e", "ui-e2e-other"
WAIT_SECONDS = 8  # the slow case: long enough that the page opens on a running gate
VERDICT_MS = 300_000
# The pages allow no script but their own (Content-Security-Policy), so axe-core is injected
# into pages opened with the policy bypassed; tests/integration/test_ui_pages.py checks it.
AXE = True


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launched_chromium()


@dataclass(frozen=True)
class Submitted:
    id: str
    url: str  # the html_url, made absolute with the address the client used
    token: str


@pytest.fixture(scope="module")
def submitted(gate_url: str, tmp_path_factory: pytest.TempPathFactory) -> Submitted:
    token = token_of(gate_url, PROJECT, ["submit", "read"])
    root = tmp_path_factory.mktemp("results-page")
    data = bundle_of(results_page_project(root / "project", wait_seconds=WAIT_SECONDS))
    answer = httpx.post(
        f"{gate_url}/v1/gates",
        files={"bundle": ("project.tar.gz", data)},
        data={"labels": '{"branch": "ui-e2e"}'},
        headers=bearer(token),
        timeout=120,
    )
    assert answer.status_code == 202, answer.text
    gate = answer.json()
    assert gate["html_url"] == f"/ui/gates/{gate['id']}"
    return Submitted(gate["id"], gate_url + gate["html_url"], token)


def verdict(gate_url: str, gate: Submitted) -> dict[str, Any]:
    deadline = time.monotonic() + VERDICT_MS / 1000
    while time.monotonic() < deadline:
        body = httpx.get(
            f"{gate_url}/v1/gates/{gate.id}?wait=20", headers=bearer(gate.token), timeout=60
        ).json()
        if body["status"] in ("passed", "failed", "error", "cancelled"):
            return dict(body)
    pytest.fail(f"gate {gate.id} had no verdict in {VERDICT_MS // 1000} s")


@pytest.fixture(scope="module")
def failed(gate_url: str, submitted: Submitted) -> Submitted:
    body = verdict(gate_url, submitted)
    assert body["status"] == "failed", body
    return submitted


def tab_stops(page: Page, presses: int) -> list[str]:
    """What the keyboard alone reaches, in order: each focused element's tag and text."""
    stops = []
    for _ in range(presses):
        page.keyboard.press("Tab")
        stops.append(
            page.evaluate(
                "() => { const e = document.activeElement;"
                " return e.tagName + ':' + (e.innerText || e.value || e.name || '').trim(); }"
            )
        )
    return stops


def test_a_running_gate_turns_failed_on_its_page_without_a_reload(
    browser: Browser, gate_url: str, submitted: Submitted
) -> None:
    page = browser.new_page()
    page.goto(submitted.url)
    # No session: the form, which comes back to the gate afterwards.
    assert "/ui/sign-in?next=" in page.url
    sign_in(page, submitted.token)
    assert page.url == submitted.url
    progress = page.locator("p.progress")
    assert progress.get_attribute("data-status") in ("queued", "running"), progress.inner_text()
    page.evaluate("window.__same_document = true")
    expect(page.locator("h1 .badge")).to_have_text("FAILED", timeout=VERDICT_MS)
    expect(progress).to_contain_text("Finished: failed")
    assert page.evaluate("window.__same_document") is True  # updated in place, not reloaded
    page.close()


def test_the_failed_gates_page_shows_every_case_and_the_reason(
    browser: Browser, failed: Submitted, tmp_path: Path
) -> None:
    page = browser.new_page(viewport={"width": 1100, "height": 900}, bypass_csp=AXE)
    page.goto(failed.url)
    sign_in(page, failed.token)
    rows = page.locator("table.cases tbody th[scope=row] a")
    expect(rows).to_have_count(3)
    # Failed first, in words as well as colour; the failing case's reason in full.
    assert rows.first.inner_text() == "expects_the_wrong_plan"
    names = set(rows.all_inner_texts())
    assert names == {
        "expects_the_wrong_plan",
        "answers_with_the_plan",
        f"waits_{WAIT_SECONDS}_seconds",
    }
    expect(page.locator("table.cases .badge", has_text="FAIL")).to_have_count(1)
    expect(page.locator("table.cases .badge", has_text="PASS")).to_have_count(2)
    expect(page.locator("table.cases pre.reason").first).to_contain_text(
        'output.plan == "enterprise"'
    )
    expect(page.get_by_text("branch=ui-e2e").first).to_be_visible()
    shot = tmp_path / "gate-page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert serious_violations(page) == []
    # Readable at 360 px: the page itself never scrolls sideways (wide tables scroll alone).
    page.set_viewport_size({"width": 360, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    page.close()


def test_the_failing_case_leads_to_its_run_and_a_mocked_tool_call_in_the_trace(
    browser: Browser, failed: Submitted, tmp_path: Path
) -> None:
    page = browser.new_page(bypass_csp=AXE)
    page.goto(failed.url)
    sign_in(page, failed.token)
    # The row's link (the failure group's link beside it jumps to the row).
    page.locator("table.cases").get_by_role("link", name="expects_the_wrong_plan").click()
    expect(page.get_by_role("heading", name="Invocations")).to_be_visible()
    expect(page.get_by_text("which plan is Ada on").first).to_be_visible()
    page.get_by_role("link", name="trace of run 1").click()
    expect(page.get_by_role("heading", name="Trace")).to_be_visible()
    mocked = page.locator("details.t-tool_call > summary", has_text="mocked").first
    # Every step starts closed: the tool call is reached by opening the steps above it.
    expect(mocked).to_be_hidden()
    above = mocked.locator("xpath=ancestor::details")
    assert above.count() >= 2  # the agent's step, its model call or tool loop, the tool call
    for i in range(above.count() - 1):
        above.nth(i).locator("xpath=./summary").click()
    expect(mocked).to_be_visible()
    details = mocked.locator("xpath=..")
    assert details.get_attribute("open") is None
    # By keyboard: focus the step's summary, Enter opens it.
    mocked.focus()
    page.keyboard.press("Enter")
    expect(details).to_have_attribute("open", "")
    expect(details.locator("dl.meta").first).to_contain_text("params")
    expect(details.locator("dl.meta").first).to_contain_text('"customer": "Ada"')
    model = page.locator("details.t-model_call > summary").first
    expect(model).to_contain_text("ms")
    # What the model was asked (issue 38, item 8): collapsed under its span, opened by hand.
    asked = model.locator("xpath=..").locator("details.request").first
    expect(asked).to_be_hidden()
    if model.locator("xpath=..").get_attribute("open") is None:
        model.click()
    summary = asked.locator("xpath=./summary")
    expect(summary).to_contain_text("request:")
    expect(summary).to_contain_text("1 tool")
    assert asked.get_attribute("open") is None
    summary.click()
    expect(asked).to_contain_text("system prompt")
    expect(asked).to_contain_text("Support.")
    expect(asked).to_contain_text("which plan is Ada on")
    expect(asked.locator("ul.tools code").first).to_have_text("lookup")
    page.screenshot(path=str(tmp_path / "run-page.png"), full_page=True)
    assert serious_violations(page) == []
    page.close()


def test_the_gate_list_finds_the_new_gate_and_filters_it(
    browser: Browser, failed: Submitted, gate_url: str
) -> None:
    page = browser.new_page(bypass_csp=AXE)
    page.goto(f"{gate_url}/ui")
    sign_in(page, failed.token)
    link = page.get_by_role("link", name=failed.id[:8])
    expect(link).to_be_visible()
    # Every action by keyboard: Tab reaches the navigation, sign-out, the filters and the gate.
    stops = tab_stops(page, 12)
    for wanted in ("A:Gates", "BUTTON:Sign out", "SELECT:", "INPUT:", "BUTTON:Filter"):
        assert any(stop.startswith(wanted) for stop in stops), (wanted, stops)
    assert f"A:{failed.id[:8]}" in stops, stops
    page.get_by_label("Status").select_option("passed")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_role("link", name=failed.id[:8])).to_have_count(0)
    page.get_by_label("Status").select_option("failed")
    page.get_by_label("Labels").fill("branch=ui-e2e")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_role("link", name=failed.id[:8])).to_be_visible()
    page.get_by_role("link", name=failed.id[:8]).click()
    assert page.url == failed.url
    assert serious_violations(page) == []
    page.close()


def test_a_finished_gate_reads_without_javascript(browser: Browser, failed: Submitted) -> None:
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(failed.url)
    sign_in(page, failed.token)
    expect(page.locator("table.cases tbody th[scope=row] a")).to_have_count(3)
    expect(page.locator("pre.reason").first).to_be_visible()
    context.close()


def test_another_projects_gate_answers_404(
    browser: Browser, failed: Submitted, gate_url: str
) -> None:
    other = token_of(gate_url, OTHER, ["read"])
    page = browser.new_page()
    page.goto(failed.url)
    sign_in(page, other)
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    response = page.goto(failed.url)
    assert response is not None and response.status == 404
    response = page.goto(f"{gate_url}/ui/gates/{uuid.uuid4()}")
    assert response is not None and response.status == 404
    page.close()


@contextmanager
def link_page(target: str) -> Iterator[str]:
    """A page on another site (localhost, where the gate is 127.0.0.1) linking to ``target``,
    as a pipeline's log links a gate."""
    body = f'<!doctype html><title>CI log</title><a href="{target}">gate</a>'.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_signing_out_ends_the_session(browser: Browser, failed: Submitted) -> None:
    page = browser.new_page()
    page.goto(failed.url)
    sign_in(page, failed.token)
    expect(page.locator("h1 .badge")).to_have_text("FAILED")
    # A link from another site carries no SameSite=Strict cookie: the form's one reload from
    # this origin takes a signed-in person straight on to the gate.
    with link_page(failed.url) as log:
        page.goto(log)
        page.get_by_role("link", name="gate").click()
        page.wait_for_url(failed.url)
    expect(page.locator("h1 .badge")).to_have_text("FAILED")
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.goto(failed.url)
    assert "/ui/sign-in?next=" in page.url
    page.close()

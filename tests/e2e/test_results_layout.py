"""The results pages read at a glance (issue 41, items 1-4 and 9), in a real browser: Debian's
Chromium, driven by Playwright, against `gate serve` with a real engine and Postgres.

One gate is submitted for the module, labelled with a commit and a branch: a project whose
cases fail for five causes (tests/fixtures/projects.py, MANY_CAUSES_PROJECT) beside passing
ones, a guardrail that is skipped and one that blocks, more than three warnings, and a live
model call through the gateway to a fake provider, so a span has a cost. The tests read the
finished gate: what is above the fold at 1280x800, the failures grouped by cause, no
sideways scrolling at 360 px on the gate, case and run pages, and the badges, durations and
costs. Screenshots are kept under $GATE_TEST_ARTIFACTS/results-layout (default
/var/tmp/gate-test-artifacts); with GATE_DOCS_SCREENSHOT set, the gate page at 1280 px is also
written there (docs/images/gate-page.png is made so).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gate_service.client.causes import CAUSES, Cause, failure_groups
from gate_service.client.shapes import CaseView
from gate_service.client.words import cut
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.browser import (
    expect,
    launched_chromium,
    serious_violations,
    sign_in,
    token_of,
)
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.projects import MANY_CAUSES, bundle_of, many_causes_project

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.docker

PROJECT = "layout-e2e"
COMMIT = "3f9c2a7e51d04b8c96e2f0a1b7d3c5e8f4a6b2d9"
BRANCH = "feature/results-at-a-glance"
VERDICT_MS = 300_000
WIDE, NARROW, HEIGHT = 1280, 360, 800
ARTIFACTS = (
    Path(os.environ.get("GATE_TEST_ARTIFACTS", "/var/tmp/gate-test-artifacts")) / "results-layout"
)
SCREENSHOT_BYTES = 10_000  # a page's screenshot with text on it is well over this
LIST_REASON_CHARS = 160  # gates.html cuts a gate's failure_reason to this
# A duration as a person reads it (client/words.py duration).
HUMAN_DURATION = re.compile(r"^(\d{1,3} ms|\d+\.\d s|\d+ min \d+ s|\d+ h \d+ min|—)$")
RAW_MS = re.compile(r"\b(\d{1,3}(,\d{3})+|\d{4,})\s?ms\b")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launched_chromium()


@pytest.fixture(scope="module")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@dataclass(frozen=True)
class Finished:
    id: str
    url: str  # the gate page's, absolute
    token: str
    body: dict[str, Any]  # GET /v1/gates/{id} once it had its verdict

    def case(self, name: str) -> dict[str, Any]:
        (found,) = [c for c in self.body["cases"] if c["test_name"] == name]
        return dict(found)

    def run_url(self, gate_url: str, name: str) -> str:
        (run_id,) = self.case(name)["agent_run_ids"]
        return f"{gate_url}/ui/runs/{run_id}"


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    """The live agent's provider (the project's OPENAI_API_BASE): answers with usage, so the
    gateway prices the call."""
    fake = FakeProvider()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture(scope="module")
def finished(
    gate_url: str, provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory
) -> Finished:
    token = token_of(gate_url, PROJECT, ["submit", "read"])
    for name, value in {"OPENAI_API_KEY": "sk-layout-e2e", "OPENAI_API_BASE": provider.url}.items():
        put = httpx.put(
            f"{gate_url}/v1/projects/{PROJECT}/secrets/{name}",
            json={"value": value},
            headers=bearer(ADMIN_TOKEN),
        )
        assert put.status_code == 201, put.text
    root = tmp_path_factory.mktemp("results-layout")
    data = bundle_of(many_causes_project(root / "project", live=True))
    answer = httpx.post(
        f"{gate_url}/v1/gates",
        files={"bundle": ("project.tar.gz", data)},
        data={"labels": json.dumps({"commit": COMMIT, "branch": BRANCH})},
        headers=bearer(token),
        timeout=120,
    )
    assert answer.status_code == 202, answer.text
    gate_id = answer.json()["id"]
    deadline = time.monotonic() + VERDICT_MS / 1000
    while time.monotonic() < deadline:
        body = httpx.get(
            f"{gate_url}/v1/gates/{gate_id}?wait=20", headers=bearer(token), timeout=60
        ).json()
        if body["status"] in ("passed", "failed", "error", "cancelled"):
            break
    else:
        pytest.fail(f"gate {gate_id} had no verdict in {VERDICT_MS // 1000} s")
    reasons = {c["test_name"]: (c["status"], c.get("failure_reason")) for c in body["cases"]}
    assert body["status"] == "failed", (body.get("failure_reason"), body.get("error"), reasons)
    failing = {c["test_name"] for c in body["cases"] if c["status"] != "passed"}
    assert failing == set(MANY_CAUSES), reasons
    return Finished(gate_id, f"{gate_url}/ui/gates/{gate_id}", token, body)


@contextmanager
def opened(
    browser: Browser, url: str, token: str, width: int, *, axe: bool = False
) -> Iterator[Page]:
    """``url`` in a fresh context of ``width`` x HEIGHT, signed in; with ``axe``, with the
    pages' Content-Security-Policy bypassed so axe-core can be injected."""
    context = browser.new_context(viewport={"width": width, "height": HEIGHT}, bypass_csp=axe)
    try:
        page = context.new_page()
        page.goto(url)
        sign_in(page, token)
        assert page.url == url
        yield page
    finally:
        context.close()


def keep_screenshot(page: Page, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > SCREENSHOT_BYTES, path


def box(page: Page, selector: str) -> dict[str, float]:
    """The first ``selector`` element's box, relative to the viewport."""
    found = page.evaluate(
        "s => { const e = document.querySelector(s); if (!e) return null;"
        " const r = e.getBoundingClientRect();"
        " return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; }",
        selector,
    )
    assert found is not None, f"no {selector} on {page.url}"
    return dict(found)


# What sticks out of the viewport on the right: the page's width, the viewport's, and the
# deepest elements whose box passes its right edge (to name what to fix).
OVERFLOW = """() => {
  const width = window.innerWidth;
  const out = [];
  for (const e of document.body.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || r.right <= width + 0.5) continue;
    if ([...e.children].some(c => c.getBoundingClientRect().right > width + 0.5)) continue;
    const name = e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
      + (typeof e.className === 'string' && e.className ? '.' + e.className.trim().split(/\\s+/).join('.') : '');
    out.push(name + ' right=' + Math.round(r.right) + ' ' + (e.innerText || '').slice(0, 40));
  }
  return {scrollWidth: document.documentElement.scrollWidth, innerWidth: width,
          offenders: out.slice(0, 12)};
}"""

# Every rendered .result element's box and text.
RESULT_BOXES = """() => [...document.querySelectorAll('.result')]
  .filter(e => e.getClientRects().length > 0)
  .map(e => { const r = e.getBoundingClientRect();
              return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
                      text: e.innerText.trim().slice(0, 40)}; })"""

OPEN_ALL = "() => document.querySelectorAll('details').forEach(d => { d.open = true; })"


def assert_no_sideways_scroll(page: Page) -> None:
    measured = page.evaluate(OVERFLOW)
    assert measured["scrollWidth"] <= measured["innerWidth"], (page.url, measured)
    results = page.evaluate(RESULT_BOXES)
    assert results, f"no .result shown on {page.url}"
    width = measured["innerWidth"]
    for shown in results:
        assert shown["left"] >= 0 and shown["right"] <= width, (page.url, shown, measured)


def significant_figures(money: str) -> int:
    """How many significant figures a shown cost under $1,000 (``$0.00004750``) has."""
    digits = money.removeprefix("$").replace(",", "").replace(".", "").lstrip("0")
    return len(digits)


def test_above_the_fold_at_1280_the_gate_names_its_commit_and_shows_its_verdict(
    browser: Browser, finished: Finished, artifacts: Path
) -> None:
    body = finished.body
    with opened(browser, finished.url, finished.token, WIDE) as page:
        # A heading a person recognises (the commit as people quote it, its first 10 hex
        # digits), the full id beside it, the full commit among the facts.
        h1 = page.locator("h1")
        expect(h1).to_have_text(f"Commit {COMMIT[:10]} on {BRANCH} FAILED")
        expect(h1.locator(".badge")).to_have_text("FAILED")
        expect(page.locator("p.gate-id")).to_contain_text(finished.id)
        expect(page.locator("dl.facts .label", has_text="commit=")).to_have_text(f"commit={COMMIT}")
        # The verdict line, in the API's own numbers.
        groups = failure_groups([CaseView.of(c) for c in body["cases"]])
        failed = sum(len(g.cases) for g in groups)
        expect(page.locator("p.progress")).to_have_text(
            f"Finished: failed, {body['passed_cases']} of {body['total_cases']} cases passed;"
            f" {failed} did not, for {len(groups)} causes."
        )
        # Above the fold, without scrolling: the verdict and the first (failed) case's Result.
        assert page.evaluate("window.scrollY") == 0
        assert box(page, "p.progress")["bottom"] <= HEIGHT
        first = page.locator("table.cases tbody tr.case").first
        expect(first.locator("td.result .badge").first).to_have_text("FAILED")
        first_result = first.locator("td.result").bounding_box()
        assert first_result is not None
        assert 0 <= first_result["y"] and first_result["y"] + first_result["height"] <= HEIGHT
        # The reading order: cases, failures by cause, facts, warnings.
        order = [
            box(page, selector)["top"]
            for selector in ("p.progress", "table.cases", "h2#why", "dl.facts", "details.warnings")
        ]
        assert order == sorted(order), order
        in_dom = page.evaluate(
            "() => ['table.cases', 'h2#why', 'dl.facts', 'details.warnings']"
            ".map(s => document.querySelector(s))"
            ".every((e, i, all) => i === 0"
            " || (all[i - 1].compareDocumentPosition(e) & Node.DOCUMENT_POSITION_FOLLOWING))"
        )
        assert in_dom is True
        # More than three warnings: collapsed, their count in the heading and the summary.
        warnings = len(body["warnings"])
        assert warnings > 3, body["warnings"]
        details = page.locator("details.warnings")
        assert details.get_attribute("open") is None
        expect(page.locator("h2#warnings")).to_have_text(f"Warnings ({warnings})")
        expect(details.locator("summary")).to_contain_text(f"{warnings} warnings")
        expect(details.locator("ul.warnings > li").first).to_be_hidden()
        details.locator("summary").click()
        expect(details.locator("ul.warnings > li")).to_have_count(warnings)
        details.locator("summary").click()  # closed again for the screenshot
        keep_screenshot(page, artifacts / "gate-1280.png")
        docs = os.environ.get("GATE_DOCS_SCREENSHOT")
        if docs:
            keep_screenshot(page, Path(docs))


def test_failures_are_grouped_by_cause_and_each_link_reaches_its_case(
    browser: Browser, finished: Finished
) -> None:
    groups = failure_groups([CaseView.of(c) for c in finished.body["cases"]])
    # The project's causes, as the engine judged them.
    assert Counter({g.cause.value: len(g.cases) for g in groups}) == Counter(MANY_CAUSES.values())
    with opened(browser, finished.url, finished.token, WIDE) as page:
        expect(page.locator("h2#why")).to_have_text("Failures by cause")
        items = page.locator("ul.causes > li")
        expect(items).to_have_count(len(groups))
        for i, group in enumerate(groups):
            item = items.nth(i)
            assert item.get_attribute("data-cause") == group.cause.value
            expect(item.locator("strong")).to_have_text(group.line)
            hrefs = item.locator("a").evaluate_all(
                "links => links.map(a => a.getAttribute('href'))"
            )
            assert sorted(hrefs) == sorted(f"#case-{c.id}" for c in group.cases), group.cause
            names = item.locator("a").all_inner_texts()
            assert sorted(names) == sorted(str(c.test_name) for c in group.cases)
            for href in hrefs:
                expect(page.locator(f"table.cases tr.case{href}")).to_have_count(1)
        # Each failed row names its cause under its Result; a passing row names none.
        for case in finished.body["cases"]:
            row = page.locator(f"#case-{case['id']}")
            cause = MANY_CAUSES.get(case["test_name"])
            if cause is None:
                expect(row.locator("td.result .badge").first).to_have_text("PASSED")
                expect(row.locator("small.cause")).to_have_count(0)
            else:
                expect(row.locator("td.result .badge").first).to_have_text("FAILED")
                expect(row.locator("small.cause")).to_have_text(CAUSES[Cause(cause)].title)
        # From the causes, scrolled to them, a link jumps back up to its case's row.
        target = groups[0].cases[0]
        anchor = f"#case-{target.id}"
        page.evaluate("document.getElementById('why').scrollIntoView()")
        assert box(page, anchor)["bottom"] <= 0, "the row is out of view before the jump"
        page.locator(f'ul.causes a[href="{anchor}"]').click()
        page.wait_for_function("h => location.hash === h", arg=anchor)
        landed = box(page, anchor)
        assert 0 <= landed["top"] < HEIGHT and landed["bottom"] <= HEIGHT, landed


@pytest.mark.parametrize("kind", ["gate", "case", "run"])
def test_at_360_px_nothing_scrolls_sideways_and_every_result_is_in_view(
    browser: Browser, finished: Finished, gate_url: str, artifacts: Path, kind: str
) -> None:
    failing = "finds_the_item_in_stock"  # a run error: the longest reason of one line
    urls = {
        "gate": finished.url,
        "case": f"{gate_url}/ui/cases/{finished.case(failing)['id']}",
        "run": finished.run_url(gate_url, "answers_within_two_seconds"),
    }
    with opened(browser, urls[kind], finished.token, NARROW) as page:
        assert page.evaluate("window.innerWidth") == NARROW
        assert_no_sideways_scroll(page)
        if kind == "gate":
            # Stacked: in each case's block the Result follows the test's name, before the
            # other cells, all within the screen.
            rows = page.locator("table.cases tbody tr.case")
            expect(rows).to_have_count(len(finished.body["cases"]))
            for i in range(rows.count()):
                shown = rows.nth(i).evaluate(
                    "tr => { const top = s => tr.querySelector(s).getBoundingClientRect();"
                    " return {name: top('th[scope=row]').bottom, result: top('td.result').top,"
                    " agent: top('td[data-label=Agent]').top,"
                    " right: top('td.result').right}; }"
                )
                assert shown["name"] <= shown["result"] < shown["agent"], shown
                assert shown["right"] <= NARROW, shown
        elif kind == "case":
            expect(page.locator("dl.facts dd.result .badge").first).to_have_text("FAILED")
            expect(page.locator("dl.facts dd.result .cause")).to_have_text(
                CAUSES[Cause.run_error].title
            )
        keep_screenshot(page, artifacts / f"{kind}-360.png")
        # Every step opened: still nothing wider than the screen.
        page.evaluate(OPEN_ALL)
        assert_no_sideways_scroll(page)


def test_badges_have_distinct_words_and_colours_durations_and_costs_read_humanly(
    browser: Browser, finished: Finished, gate_url: str
) -> None:
    colours: dict[str, str] = {}

    def colour_of(page: Page, outcome: str, word: str) -> None:
        badge = page.locator(f".badge.o-{outcome}").first
        expect(badge).to_have_text(word)
        colours[outcome] = badge.evaluate("e => getComputedStyle(e).color")

    with opened(browser, finished.url, finished.token, WIDE) as page:
        colour_of(page, "passed", "PASSED")
        colour_of(page, "failed", "FAILED")
        for case in finished.body["cases"]:
            words = page.locator(f"#case-{case['id']} td.result .badge").first
            expect(words).to_have_text("PASSED" if case["status"] == "passed" else "FAILED")
        # The gate's model calls: the live call's cost, with its currency.
        calls = page.locator("dl.facts dt", has_text="Model calls").locator(
            "xpath=./following-sibling::dd[1]"
        )
        expect(calls).to_contain_text("1 model call answered")
        gate_cost = re.search(r"\$[\d,.]+", calls.inner_text())
        assert gate_cost is not None and significant_figures(gate_cost.group()) == 4, gate_cost
    # The guardrails: a judged one skipped (scripted mode calls no judge), a regex one blocked.
    guarded = finished.run_url(gate_url, "blocks_a_forbidden_request")
    with opened(browser, guarded, finished.token, WIDE) as page:
        page.evaluate(OPEN_ALL)
        rails = page.locator("details.t-guardrail > summary .badge")
        assert sorted(rails.all_inner_texts()) == ["BLOCKED", "SKIPPED"]
        colour_of(page, "skipped", "SKIPPED")
        colour_of(page, "blocked", "BLOCKED")
        expect(page.locator("dd.result .badge.o-passed")).to_have_text("PASSED")
    assert len(set(colours.values())) == len(colours), colours
    # Durations in human units: a 2 s timeout reads in seconds, no raw milliseconds over 999.
    timed_out = finished.run_url(gate_url, "answers_within_two_seconds")
    with opened(browser, timed_out, finished.token, WIDE) as page:
        page.evaluate(OPEN_ALL)
        took = page.locator("dl.facts dt", has_text="Duration").first.locator(
            "xpath=./following-sibling::dd[1]"
        )
        text = took.inner_text().strip()
        assert re.fullmatch(r"\d+\.\d s", text) and float(text[:-2]) >= 2.0, text
        for shown in page.locator("span.ms").all_inner_texts():
            assert HUMAN_DURATION.match(shown.strip()), shown
        assert RAW_MS.search(page.locator("main").inner_text()) is None
    # A live model span's cost: its currency and four significant figures.
    live = finished.run_url(gate_url, "greets_through_the_gateway")
    with opened(browser, live, finished.token, WIDE) as page:
        page.evaluate(OPEN_ALL)
        cost = page.locator("details.t-model_call dl.meta dt", has_text="cost_usd").first
        shown = cost.locator("xpath=./following-sibling::dd[1]").inner_text().strip()
        assert re.fullmatch(r"\$[\d,]+\.\d+", shown), shown
        assert significant_figures(shown) == 4, shown
        for ms in page.locator("span.ms").all_inner_texts():
            assert HUMAN_DURATION.match(ms.strip()), ms


def test_a_long_reason_in_the_gate_list_is_cut_and_says_how_much(
    browser: Browser, finished: Finished, gate_url: str
) -> None:
    reason = finished.body["failure_reason"]
    assert len(reason) > LIST_REASON_CHARS, reason
    with opened(browser, f"{gate_url}/ui", finished.token, NARROW) as page:
        row = page.locator("tr", has=page.get_by_role("link", name=finished.id[:8]))
        cell = row.locator("td.reason-cell")
        shown = cut(reason, LIST_REASON_CHARS)
        assert shown.endswith(f"…[{len(reason) - LIST_REASON_CHARS:,} more characters]")
        expect(cell).to_have_text(shown)
        measured = page.evaluate(OVERFLOW)
        assert measured["scrollWidth"] <= measured["innerWidth"], measured


@pytest.mark.parametrize("width", [WIDE, NARROW])
def test_the_gate_page_has_no_serious_accessibility_violation(
    browser: Browser, finished: Finished, width: int
) -> None:
    with opened(browser, finished.url, finished.token, width, axe=True) as page:
        assert serious_violations(page) == []

"""The Markdown summary for a pull-request comment (gate_service/baselines/summary.py): what
it lists, and that a bundle's text cannot inject anything into the comment.

Rendered with markdown-it-py (CommonMark and GFM tables, what GitHub and GitLab render): the
HTML it gives is the judge of what the comment would show.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from markdown_it import MarkdownIt

from gate_service.baselines.summary import MAX_ROWS, gate_summary, md_text

GATE = "0b6f3c1e-0000-4000-8000-000000000001"
BASE = "5a5a5a5a-0000-4000-8000-000000000002"
RENDER = MarkdownIt("commonmark", {"html": True}).enable("table")


def case(name: str, **fields: Any) -> dict[str, Any]:
    status = fields.pop("status", "passed")
    return {
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
        "suite": "tests/bot.yaml",
        "agent_name": "bot",
        "test_name": name,
        "status": status,
        "passed": status == "passed",
        "successes": 10,
        "runs": 10,
        "success_threshold": 80,
        "interval": {"low": 72.25, "high": 100.0},
        "narrow": False,
        **fields,
    }


def baseline(successes: int, runs: int, p_value: float | None = 0.5, **more: Any) -> dict[str, Any]:
    return {
        "gate_id": BASE,
        "case_id": str(uuid.uuid4()),
        "successes": successes,
        "runs": runs,
        "comparable": True,
        "why": None,
        "p_value": p_value,
        "drop_points": 0.0,
        **more,
    }


def gate(status: str, cases: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"id": GATE, "status": status, "failure_reason": None, "cases": cases, **fields}


def table_rows(html: str) -> list[list[str]]:
    body = html.split("<tbody>", 1)[1] if "<tbody>" in html else ""
    return [
        re.findall(r"<td>(.*?)</td>", row, re.S)
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def test_a_gate_whose_cases_all_passed_plainly_is_its_heading_and_one_line() -> None:
    text = gate_summary(gate("passed", [case("greets"), case("answers")]))
    assert text == (
        f"### ✅ Deploy gate passed\n\n2 cases: 2 passed. [Results](/ui/gates/{GATE})\n"
    )


def test_the_table_lists_each_kind_of_case_with_rates_intervals_baseline_and_p() -> None:
    cases = [
        case("fine", baseline=baseline(10, 10, 1.0), regression_level="none"),
        case(
            "dropped",
            successes=3,
            interval={"low": 10.78, "high": 60.32},
            baseline=baseline(10, 10, 0.0015),
            regression_level="regression",
            regression=True,
        ),
        case("wobbly", successes=8, baseline=baseline(10, 10, 0.24), regression_level="likely"),
        case(
            "broken",
            status="failed",
            successes=1,
            failure_reason="1/10 runs passed",
            baseline=baseline(1, 10, 0.5),
            regression_level="none",
        ),
        case(
            "coin",
            flaky={"gates": 6, "passed_gates": 3, "successes": 40, "runs": 60, "low": 54, "high": 77},
        ),
        case(
            "parked",
            status="failed",
            successes=0,
            quarantine={"owner": "ana", "reason": "upstream", "expires_at": "2027-01-31T00:00:00Z"},
        ),
        case("close", successes=9, interval={"low": 59.58, "high": 99.49}, narrow=True),
        case("brand_new", baseline={**baseline(0, 0), "case_id": None, "successes": None,
                                    "runs": None, "comparable": False, "p_value": None}),
        case("cached", reused_from=str(uuid.uuid4())),
    ]  # fmt: skip
    text = gate_summary(
        gate("failed", cases, baseline_gate_id=BASE), public_url="https://g.example"
    )
    assert text.startswith("### ❌ Deploy gate failed\n\n")
    assert "9 cases: 6 passed, 2 failed, 1 reused from the baseline." in text
    assert f"[`5a5a5a5a`](https://g.example/ui/gates/{BASE})" in text
    html = RENDER.render(text)
    rows = table_rows(html)
    names = [re.sub(r"<[^>]+>", "", row[0]) for row in rows]
    # Failed first, then regressed, likely, flaky, quarantined, narrow; the plain, the new and
    # the reused are not listed.
    assert names == [
        "bot::broken", "bot::parked", "bot::dropped", "bot::wobbly", "bot::coin", "bot::close",
    ]  # fmt: skip
    by_name = dict(zip(names, rows, strict=True))
    assert all(len(row) == 6 for row in rows)  # Case, Why, Rate, Interval, Baseline, p
    assert by_name["bot::dropped"][1:] == [
        "regression", "3/10 (30%)", "10.8-60.3%", "10/10 (100%)", "0.0015",
    ]  # fmt: skip
    assert by_name["bot::wobbly"][1] == "likely regression"
    assert by_name["bot::broken"][1] == "failed"
    assert by_name["bot::coin"][1] == "flaky (passed 3 of 6 gates)"
    assert by_name["bot::coin"][4:] == ["—", "—"]  # not compared: no baseline of its own
    assert by_name["bot::parked"][1] == "failed, quarantined (ana, until 2027-01-31)"
    assert by_name["bot::close"][1:4] == ["narrow (threshold 80%)", "9/10 (90%)", "59.6-99.5%"]
    case_ids = {c["test_name"]: c["id"] for c in cases}
    assert f'<a href="https://g.example/ui/cases/{case_ids["dropped"]}">bot::dropped</a>' in html


def test_links_are_paths_without_a_public_url_and_an_error_says_why() -> None:
    text = gate_summary(
        gate("error", [], failure_reason="2 suite(s) are invalid", baseline="label:branch=main")
    )
    assert text == (
        "### ⚠️ Deploy gate could not judge (error)\n\n"
        f"No case was judged. Baseline label\\:branch\\=main named no gate. [Results](/ui/gates/{GATE})\n\n"
        "**Why:** 2 suite\\(s\\) are invalid\n"
    )


def test_a_long_list_is_cut_and_the_rest_counted() -> None:
    cases = [case(f"c{n}", status="failed", successes=0) for n in range(MAX_ROWS + 7)]
    html = RENDER.render(gate_summary(gate("failed", cases)))
    assert len(table_rows(html)) == MAX_ROWS
    assert f'… and 7 more on the <a href="/ui/gates/{GATE}">gate page</a>.' in html


# 93 characters: with "::victim" still under MAX_NAME_CHARS (120), so none of it is cut.
HOSTILE = (
    "a|b</td><script>x</script>\n| c | d |\r\u202e`e` [f](https://evil.example) "
    "@octocat #1 &amp; ![g](h)"
)
# Every attack at once, longer than a name: md_text with no limit.
ATTACKS = (
    "x | y</td><script>alert(1)</script>\n| injected | row |\n"
    "```\nfence\n``` `code` [link](https://evil.example) ![img](https://evil.example/i.png) "
    "<img src=x onerror=alert(1)> **bold** _em_ ~~del~~ @octocat #1 &amp; &#60;b&#62; \\| "
    "\u202e\u200b\r\n# heading\n> quote\n- item\n<!-- c --> <https://evil.example> [r]: /x"
)


@pytest.mark.parametrize("where", ["test_name", "agent_name"])
def test_a_hostile_case_name_stays_text_in_one_cell(where: str) -> None:
    hostile = case(
        "victim",
        status="failed",
        successes=0,
        quarantine={"owner": HOSTILE, "reason": "r", "expires_at": "2027-01-31T00:00:00Z"},
    )
    hostile[where] = HOSTILE
    text = gate_summary(gate("failed", [hostile, case("other", status="failed", successes=0)]))
    html = RENDER.render(text)
    # One table, two rows of four cells: nothing split a cell or added a row.
    assert html.count("<table>") == 1
    rows = table_rows(html)
    assert [len(row) for row in rows] == [4, 4]
    # No element of the name's: only our links, no script, image, code, emphasis or heading.
    assert re.findall(r"<(\w+)", html) == [
        "h3", "p", "a", "table", "thead", "tr", "th", "th", "th", "th", "tbody",
        "tr", "td", "a", "td", "td", "td", "tr", "td", "a", "td", "td", "td",
    ]  # fmt: skip
    hrefs = re.findall(r'href="([^"]*)"', html)
    assert all(h.startswith("/ui/") for h in hrefs) and len(hrefs) == 3
    # The text reads as it was, with its controls written out, and no one is mentioned.
    cell = rows[0][0]
    assert "&lt;/td&gt;&lt;script&gt;x&lt;/script&gt;" in cell
    assert "\\x0a" in cell and "\\u202e" in cell and "\\x0d" in cell
    assert "@\u200boctocat" in cell and "#\u200b1" in cell
    assert "&amp;amp;" in cell  # the name's own entity is text, not a character
    # Each row is one line of the text: the header, its rule and the two cases.
    assert len([line for line in text.splitlines() if line.startswith("| ")]) == 4


def test_md_text_escapes_every_markdown_character_and_cuts() -> None:
    assert md_text("a|b`c*d_e[f]g(h)i<j>&k") == "a\\|b\\`c\\*d\\_e\\[f\\]g\\(h\\)i&lt;j&gt;&amp;k"
    assert md_text("x" * 10, limit=4) == "xxxx…\\[6 more characters\\]"  # words.cut, escaped
    assert md_text("line\nbreak") == "line\\\\x0abreak"
    # Rendered, every escape reads back as the text itself.
    plain = "a|b`c*d_e[f]g(h)!~=+-.#1 @me"
    shown = RENDER.renderInline(md_text(plain))
    assert shown == plain.replace("#1", "#\u200b1").replace("@me", "@\u200bme")


def test_every_attack_at_once_renders_as_the_text_of_one_cell() -> None:
    html = RENDER.render(f"| a |\n| --- |\n| {md_text(ATTACKS)} |\n")
    assert re.findall(r"<(\w+)", html) == ["table", "thead", "tr", "th", "tbody", "tr", "td"]
    (cell,) = table_rows(html)[0]
    # What was written is what reads: the attack as text, its controls written out.
    shown = ATTACKS.replace("\n", "\\x0a").replace("\r", "\\x0d").replace("\u202e", "\\u202e")
    shown = shown.replace("\u200b", "\\u200b").replace("@", "@\u200b").replace("#", "#\u200b")
    assert cell == shown.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

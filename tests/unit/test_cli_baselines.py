"""`gate submit` with baselines: --baseline, --changed-only and --markdown on the wire and on
disk, and what the terminal shows per case (baseline rates and regression level, quarantine,
flaky, narrow interval, early stop, reuse); an older service's answer reads as before."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from gate_service.client.api import absolute_links
from gate_service.client.render import render_results
from gate_service.client.shapes import CaseView, GateView
from tests.fixtures.projects import calculator_project
from tests.unit.test_cli_submit import GATE_ID, PASSED, FakeGate, case, gate, run_cli

BASE = "5a5a5a5a-0000-4000-8000-000000000002"
BASE_CASE = "5a5a5a5a-0000-4000-8000-0000000000ca"
QUARANTINE = {"owner": "ana", "reason": "upstream flake", "expires_at": "2027-01-31T00:00:00Z"}


def compared(successes: int, runs: int, p_value: float, **more: Any) -> dict[str, Any]:
    return {
        "gate_id": BASE,
        "case_id": BASE_CASE,
        "successes": successes,
        "runs": runs,
        "comparable": True,
        "why": None,
        "p_value": p_value,
        "drop_points": 0.0,
        **more,
    }


def marked_gate() -> dict[str, Any]:
    dropped = case("dropped", passed=True, runs=10, successes=3)
    dropped.update(baseline=compared(10, 10, 0.0015), regression_level="regression")
    wobbly = case("wobbly", passed=True, runs=10, successes=8)
    wobbly.update(baseline=compared(10, 10, 0.237), regression_level="likely")
    parked = case("parked", passed=False, runs=2, reason="0/2 runs passed")
    parked.update(quarantine=QUARANTINE)
    coin = case("coin", passed=True, runs=4, successes=4)
    coin.update(flaky={"gates": 6, "passed_gates": 3, "successes": 40, "runs": 60,
                       "low": 54.1, "high": 77.0})  # fmt: skip
    close = case("close", passed=True, runs=10, successes=9)
    close.update(interval={"low": 59.58, "high": 99.49}, narrow=True, success_threshold=80)
    early = case("early", passed=True, runs=10, successes=3)
    early.update(stopped_early=True, invocations_run=3)
    cached = case("cached", passed=True)
    cached.update(reused_from=BASE_CASE, baseline=compared(2, 2, 1.0, comparable=False))
    brand_new = case("brand_new", passed=True)
    brand_new.update(baseline={**compared(0, 0, 0), "case_id": None, "successes": None,
                               "runs": None, "comparable": False, "p_value": None})  # fmt: skip
    changed = case("changed", passed=True)
    changed.update(baseline=compared(2, 2, 0, comparable=False, why="the case's own YAML changed"))
    return gate(
        "failed",
        [dropped, wobbly, parked, coin, close, early, cached, brand_new, changed],
        failure_reason="1 case(s) regressed against the baseline",
        baseline="label:branch=main",
        baseline_gate_id=BASE,
        changed_only=True,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return calculator_project(tmp_path / "p", failing=False)


def rendered(answer: dict[str, Any], *, verbose: bool = False) -> str:
    out = io.StringIO()
    render_results(Console(file=out, width=200, color_system=None), answer, verbose=verbose)
    return out.getvalue()


def test_each_case_says_its_baseline_quarantine_flakiness_interval_early_stop_and_reuse() -> None:
    out = rendered(marked_gate())
    assert "Baseline" in out  # the column, since the gate was compared
    lines = {line.split("│")[2].strip(): line for line in out.splitlines() if line.count("│") > 4}
    assert "10/10 regression" in lines["calc::dropped"]
    assert "10/10 likely regression" in lines["calc::wobbly"]
    assert "REUSED" in lines["calc::cached"]
    assert "3/3 of 10" in lines["calc::early"]
    assert "new" in lines["calc::brand_new"] and "not comparable" in lines["calc::changed"]
    for note in (
        "regressed against baseline gate 5a5a5a5a: 10/10 (100%) then, 3/10 (30%) now, "
        "one-sided Fisher p = 0.0015; this fails the gate",
        "likely regressed against baseline gate 5a5a5a5a: 10/10 (100%) then, 8/10 (80%) now, "
        "one-sided Fisher p = 0.237; a warning",
        "quarantined by ana until 2027-01-31: upstream flake (its failure does not fail the gate)",
        "flaky: passed 3 of its last 6 gates with this closure, 40/60 (67%) of their runs "
        "(95% interval 54.1-77.0%)",
        "narrow: its 95% interval 59.6-99.5% holds the 80% threshold, so more runs would tell",
        "stopped early after 3 of 10 runs: the verdict could no longer change",
        "reused: it passed in baseline gate 5a5a5a5a with the same closure, so it was not run "
        "again (that gate's case 5a5a5a5a)",
        "new since the baseline",
        "not compared with the baseline: the case's own YAML changed",
    ):
        assert note in out, note
    # Notes sit under their case's name, after the first failure and before the table.
    first = out.index("→ First failure: calc::parked\n    0/2 runs passed\n")
    assert first < out.index("→ Notes:") < out.index("    calc::dropped\n") < out.index("│ Result")
    assert "calc::parked (quarantined): 0/2 runs passed" in rendered(marked_gate(), verbose=True)
    assert "baseline: label:branch=main, gate 5a5a5a5a-0000-4000-8000-000000000002; changed " \
           "cases only, 1 reused" in out  # fmt: skip
    # Passed: neither the regressed case (it fails the gate) nor the quarantined and the
    # reused ones (skipped), as JUnit and the pages count them.
    assert "7/9 cases passed (1 regressed, 1 likely regressed, 1 quarantined, 1 flaky, " \
           "1 reused)." in out  # fmt: skip


def test_a_hostile_quarantine_reason_cannot_reach_the_terminal_as_escapes() -> None:
    answer = gate("passed", [case("adds", passed=True)])
    answer["cases"][0]["quarantine"] = {**QUARANTINE, "reason": "x\x1b[2J\x1b]8;;evil\x07y"}
    out = rendered(answer)
    assert "\x1b" not in out and "x\\x1b[2J\\x1b]8;;evil\\x07y" in out


def test_an_older_services_answer_has_no_baseline_column_and_no_notes() -> None:
    out = rendered(gate("failed", [case("adds", passed=True), case("no", passed=False)]))
    assert "Baseline" not in out and "Notes" not in out and "1/2 cases passed." in out
    # A baselines field of the wrong type reads as missing, as every other field does.
    view = CaseView.of({**case("x", passed=True), "baseline": "gate?", "flaky": [1]})
    assert view.baseline is None and view.flaky is None
    assert GateView.of({"baseline_gate_id": 7}).baseline_gate_id is None


class SummaryGate(FakeGate):
    """FakeGate, and GET /v1/gates/{id}/summary.md answers ``summary`` (a path-linked one)."""

    def __init__(self, states: list[dict[str, Any]], summary: httpx.Response) -> None:
        super().__init__(states)
        self.summary = summary

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == f"/v1/gates/{GATE_ID}/summary.md":
            self.requests.append(request)
            return self.summary
        return super().__call__(request)


SUMMARY = (
    "### ✅ Deploy gate passed\n\n"
    f"1 case: 1 passed. [Results](/ui/gates/{GATE_ID})\n"
    "| [bot\\](/ui/x) ](/ui/cases/c1) |\n"
)


def test_baseline_changed_only_and_markdown_go_on_the_wire_and_to_the_file(
    use_api: Callable[[FakeGate], None],
    project: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = SummaryGate(
        [PASSED], httpx.Response(200, text=SUMMARY, headers={"content-type": "text/markdown"})
    )
    use_api(fake)
    target = tmp_path / "out" / "summary.md"
    code, _, _ = run_cli(
        capsys,
        str(project),
        "--baseline", "label:branch=main",
        "--changed-only",
        "--markdown", str(target),
    )  # fmt: skip
    assert code == 0
    posted = next(r for r in fake.requests if r.method == "POST").content
    assert b'name="baseline"\r\n\r\nlabel:branch=main' in posted
    assert b'name="changed_only"\r\n\r\ntrue' in posted
    # The service has no GATE_PUBLIC_URL: its page links are made absolute with the address
    # the client reached; a "](/ui/" a case name holds (escaped) is left as it was.
    assert target.read_text() == (
        "### ✅ Deploy gate passed\n\n"
        f"1 case: 1 passed. [Results](http://gate.test/ui/gates/{GATE_ID})\n"
        "| [bot\\](/ui/x) ](http://gate.test/ui/cases/c1) |\n"
    )


def test_without_the_flags_nothing_of_baselines_is_sent(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeGate([PASSED])
    use_api(fake)
    assert run_cli(capsys, str(project))[0] == 0
    posted = next(r for r in fake.requests if r.method == "POST").content
    assert b'name="baseline"' not in posted and b'name="changed_only"' not in posted


def test_a_summary_the_service_refuses_exits_2_after_the_results(
    use_api: Callable[[FakeGate], None],
    project: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    refused = httpx.Response(404, json={"error": "NotFound", "detail": "Not Found"})
    use_api(SummaryGate([PASSED], refused))
    target = tmp_path / "summary.md"
    junit = tmp_path / "junit.xml"
    code, out, err = run_cli(capsys, str(project), "--markdown", str(target), "--junit", str(junit))
    assert code == 2 and "could not fetch the gate's Markdown summary: 404" in err
    assert not target.exists()
    # The verdict's own outputs came all the same.
    assert junit.exists() and "1/1 cases passed." in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--changed-only"], "needs --baseline"),
        (["--markdown", "x.md", "--no-wait"], "drop --no-wait"),
    ],
)
def test_flags_that_cannot_work_are_usage_errors_before_any_request(
    argv: list[str],
    says: str,
    use_api: Callable[[FakeGate], None],
    project: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeGate([PASSED])
    use_api(fake)
    code, _, err = run_cli(capsys, str(project), *argv)
    assert code == 2 and says in err
    assert fake.requests == []


def test_absolute_links_rewrites_only_page_links() -> None:
    text = "[a](/ui/gates/1) \\](/ui/x) [b](https://g/ui/cases/2) [c](/v1/gates/1)"
    assert absolute_links(text, "http://h:8080/ui/") == (
        "[a](http://h:8080/ui/gates/1) \\](/ui/x) [b](https://g/ui/cases/2) [c](/v1/gates/1)"
    )

"""`gate submit`'s results as a terminal shows them (issue 41): the summary last, so the last
screen is what a person reads first. Rendered on an emulated terminal (rich's recording
console, 120 and 80 columns) and read back as text."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from gate_service.cli import main
from gate_service.client.render import (
    GateProgress,
    progress_line,
    render_results,
    trace_lines,
)
from gate_service.client.shapes import GateView
from gate_service.client.words import duration, money
from tests.fixtures.projects import calculator_project
from tests.unit.test_cli_submit import GATE_ID, FakeGate, case, gate, run_cli

URL = f"http://gate.test/ui/gates/{GATE_ID}"
WIDTHS = (120, 80)
BOX = "┌│├└"


def span(
    span_id: str, parent: str | None, order: int, status: str, name: str, **meta: Any
) -> dict[str, Any]:
    """A span; a ``guard:`` name is a guardrail's."""
    kind = "guardrail" if name.startswith("guard:") else "tool_call"
    return {
        "span_id": span_id,
        "parent_span_id": parent,
        "span_order": order,
        "type": kind,
        "name": name.removeprefix("guard:"),
        "status": status,
        "duration_ms": 7,
        "metadata": meta,
    }


# A failed run's trace: the agent, a guardrail that let the text through, a passing tool,
# a failing tool under which a model call passed, a guardrail skipped for want of a provider.
TRACE = [
    span("root", None, 1, "error", "calc"),
    span("pii_in", "root", 2, "passed", "guard:pii", direction="input"),
    span("add", "root", 3, "ok", "add", tool_name="math_ops.add"),
    span("double", "root", 4, "error", "double", tool_name="math_ops.double", error="KeyError"),
    span("model", "double", 1, "ok", "openai/gpt-4o"),
    span("pii_out", "root", 5, "skipped", "guard:pii", direction="output"),
]

SENTENCE = (
    "1 of 2 invocation(s) failed (1 passed, 2 needed for 100%); first failure (invocation 1): "
)
RESULT_FALSE = "expected_result `output.sum == 5` was false (seen: output.sum = 4)"
SCHEMA = "agent error: output_schema 'report': output: 'total' is a required property (required)"
PROVIDER = (
    "1 of 2 invocation(s) could not be judged, because a model call failed for a reason that "
    "is not the agent's (invocation 1: HTTP 401); fix the project's keys, routes or budgets "
    "(or the provider) and submit again"
)
QUARANTINE = {"owner": "ana", "reason": "upstream", "expires_at": "2027-01-31T00:00:00Z"}


def failed_runs(run_id: str) -> dict[str, Any]:
    run = {"run_id": run_id, "status": "failed", "input": {"a": 2}, "output": {"sum": 4}}
    return {"total_failed": 1, "shown": [{**run, "error": "KeyError: 'sum'", "traces": TRACE}]}


def results_gate(**extra: Any) -> dict[str, Any]:
    wrong = case("wrong_sum", passed=False, reason=SENTENCE + RESULT_FALSE)
    wrong["failed_runs"] = failed_runs("run-wrong-0")
    schema = case("schema", passed=False, reason=SENTENCE + SCHEMA)
    schema["failed_runs"] = failed_runs("run-schema-1")
    parked = case("parked", passed=False, reason=SENTENCE + RESULT_FALSE)
    parked["quarantine"] = QUARANTINE
    dropped = case("dropped", passed=True)
    dropped["regression_level"] = "regression"
    unjudged = case("unjudged", passed=None, status="error", reason=PROVIDER)
    answer = gate(
        "failed",
        [case("adds", passed=True), wrong, schema, parked, dropped, unjudged],
        failure_reason="4 of 6 cases failed",
        html_url=URL,
        warnings=[{"file": f"agents/a{i}.yaml", "message": f"warning {i}"} for i in range(5)],
        model_mode="scripted",
        model_calls={"calls": 3, "answered": 3, "tokens_in": 1200, "tokens_out": 300,
                     "cost_usd": 0.0012799999999999999},
        baseline="label:branch=main",
        baseline_gate_id="5a5a5a5a-0000-4000-8000-000000000002",
    )  # fmt: skip
    answer.update(extra)
    return answer


def screen(answer: dict[str, Any], width: int, **options: Any) -> list[str]:
    """What a terminal of ``width`` columns shows, as lines of text."""
    console = Console(file=io.StringIO(), record=True, width=width, force_terminal=True)
    render_results(console, answer, **options)
    return console.export_text().splitlines()


def at(lines: list[str], text: str) -> int:
    """The index of the first line holding ``text``."""
    return next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("verbose", [False, True])
def test_the_verdict_and_the_page_are_the_last_lines(width: int, verbose: bool) -> None:
    lines = screen(results_gate(), width, verbose=verbose)
    *_, verdict, url = [line for line in lines if line.strip()]
    assert verdict == (
        # By outcome, as the page and JUnit count: the regressed case did not pass.
        f"  ✗ 1/6 cases passed (1 regressed, 1 quarantined).  gate {GATE_ID}: FAILED"
    )
    assert url == f"  {URL}"
    # Details, warnings, notes, facts, groups, table, verdict: in that order.
    details = at(lines, "→ Failure details:" if verbose else "→ First failure:")
    order = [
        details,
        at(lines, "⚠ 5 warning(s)"),
        at(lines, "→ Notes:"),
        at(lines, "model mode: scripted"),
        at(lines, "3 model calls answered, tokens 1,200 in / 300 out, cost $0.001280"),
        at(lines, "baseline: label:branch=main, gate 5a5a5a5a"),
        at(lines, "→ Failures by cause:"),
        at(lines, "┌"),
        at(lines, "└"),
        at(lines, "cases passed"),
        at(lines, URL),
    ]
    assert order == sorted(order), order


@pytest.mark.parametrize("width", WIDTHS)
def test_the_table_fits_the_terminal_and_only_words_run_past_it(width: int) -> None:
    answer = results_gate()
    answer["cases"].append(case("a_very_long_name_" + "x" * 150, passed=True))
    lines = screen(answer, width)
    table = [line for line in lines if line[:1] in BOX]
    assert len(table) > 8 and all(len(line) <= width for line in table)
    # What runs past the width is soft-wrapped text (the terminal folds it), never cut.
    assert any(len(line) > width for line in lines if line[:1] not in BOX) == (width == 80)
    joined = "\n".join(lines)
    assert "  ⚠ 5 warning(s): what this gate does not run as the platform would, so a pass " \
           "covers less" in joined  # fmt: skip
    assert f"gate {GATE_ID}: FAILED" in joined


def test_each_case_reads_its_outcomes_word_and_marks() -> None:
    lines = screen(results_gate(), 120)
    rows = {line.split("│")[2].strip(): line.split("│")[1].split() for line in lines if line.startswith("│ ") and "::" in line}  # fmt: skip
    assert rows == {
        "calc::adds": ["PASSED"],
        "calc::wrong_sum": ["FAILED"],
        "calc::schema": ["FAILED"],
        "calc::parked": ["SKIPPED", "QUARANTINED"],
        "calc::dropped": ["FAILED", "REGRESSED"],
        "calc::unjudged": ["ERROR"],
    }
    joined = "\n".join(lines)
    for old in (" PASS ", " FAIL ", " SKIP "):
        assert old not in joined


def test_failures_by_cause_the_agents_first_and_the_table_after_them() -> None:
    lines = screen(results_gate(), 120)
    start = at(lines, "→ Failures by cause:")
    groups = lines[start + 1 : at(lines, "┌")]
    assert [line for line in groups if line.strip()] == [
        "    2 cases: expected_result was false",
        "      calc::wrong_sum, calc::parked",
        "    1 case: the answer did not match the agent's output_schema",
        "      calc::schema",
        "    1 case: regressed against the baseline",
        "      calc::dropped",
        "    1 case: a provider or configuration error (keys, routes, budgets), not the agent",
        "      calc::unjudged",
    ]


def test_a_large_group_names_five_cases_and_counts_the_rest() -> None:
    cases = [case(f"c{i}", passed=False, reason=SENTENCE + RESULT_FALSE) for i in range(8)]
    lines = screen(gate("failed", cases), 120)
    assert "    8 cases: expected_result was false" in lines
    assert "      calc::c0, calc::c1, calc::c2, calc::c3, calc::c4 and 3 more" in lines


def test_without_verbose_only_the_first_failed_runs_failing_path() -> None:
    lines = screen(results_gate(), 120)
    text = "\n".join(lines)
    first = at(lines, "→ First failure: calc::wrong_sum")
    assert lines[first + 1] == f"    {RESULT_FALSE}"  # its first failing check, not the sentence
    assert "Error: KeyError: 'sum'" in lines[first + 2]
    assert lines[first + 3] == "    Spans on the way (run run-wrong-0):"
    assert lines[first + 4 : first + 6] == [
        "    ✗ calc FAILED (7 ms)",
        "      ✗ math_ops.double FAILED (7 ms) — KeyError",
    ]
    assert "(--verbose: every failed run with its whole trace)" in lines[first + 6]
    # Passing spans beside the path are not printed, nor any other run or case's details.
    for absent in ("math_ops.add", "openai/gpt-4o", "✓", "run-schema-1", "Failure details",
                   "Input:", SENTENCE.strip()):  # fmt: skip
        assert absent not in text, absent


def test_verbose_shows_every_failed_run_and_whole_traces() -> None:
    text = "\n".join(screen(results_gate(), 120, verbose=True))
    assert "→ First failure" not in text and "--verbose:" not in text
    assert f"    ✗ calc::wrong_sum: {SENTENCE}{RESULT_FALSE}" in text
    assert "    ✗ calc::parked (quarantined): " in text
    assert "Run run-wrong-0" in text and "Run run-schema-1" in text
    assert text.count("✓ math_ops.add (7 ms)") == 2
    assert text.count("  ✓ openai/gpt-4o (7 ms)") == 2  # under the failing tool


def test_a_guardrail_reads_its_own_outcome_never_a_failure() -> None:
    lines = [str(line) for line in trace_lines(TRACE, indent=0)]
    assert lines == [
        "✗ calc FAILED (7 ms)",
        "  ✓ pii (7 ms)",  # it let the text through: passed
        "  ✓ math_ops.add (7 ms)",
        "  ✗ math_ops.double FAILED (7 ms) — KeyError",
        "    ✓ openai/gpt-4o (7 ms)",
        "  ○ pii SKIPPED (7 ms)",  # not judged here: skipped, not failed
    ]
    odd = [
        span("w", None, 1, "warned", "guard:tone", message="rude"),
        span("b", None, 2, "blocked", "guard:secrets", message="held a key"),
        span("x", None, 3, "paused", "step", error="why"),
        span("t", None, 4, "timeout", "slow", error="stopped"),
    ]
    assert [str(line) for line in trace_lines(odd, indent=2)] == [
        "  ! tone WARNED (7 ms)",
        "  ⊘ secrets BLOCKED (7 ms) — held a key",
        "  · step PAUSED (7 ms) — why",
        "  ✗ slow FAILED (7 ms) — stopped",
    ]


def test_the_failing_path_keeps_ancestors_and_drops_passing_siblings() -> None:
    path = [str(line) for line in trace_lines(TRACE, indent=0, failing_path=True)]
    # Only what went wrong and the way to it: a skipped guardrail is left for --verbose.
    assert path == [
        "✗ calc FAILED (7 ms)",
        "  ✗ math_ops.double FAILED (7 ms) — KeyError",
    ]
    # A failing span deep under passing ones brings its ancestors; a cycle ends the walk.
    deep = [
        span("a", None, 1, "ok", "a"),
        span("b", "a", 1, "ok", "b"),
        span("sib", "a", 2, "ok", "sibling"),
        span("c", "b", 1, "error", "c"),
        span("self", "self", 1, "error", "its own parent"),
        # A cycle has no root, so the tree never shows it; the walk up it ends all the same.
        span("loop1", "loop2", 1, "error", "loop1"),
        span("loop2", "loop1", 1, "ok", "loop2"),
    ]
    assert [str(line) for line in trace_lines(deep, indent=0, failing_path=True)] == [
        "✓ a (7 ms)",
        "  ✓ b (7 ms)",
        "    ✗ c FAILED (7 ms)",
        "✗ its own parent FAILED (7 ms)",
    ]
    assert trace_lines(TRACE[2:3], indent=0, failing_path=True) == []


def test_warnings_are_three_then_a_count_unless_verbose() -> None:
    lines = screen(results_gate(), 120)
    shown = [line for line in lines if line.startswith("    - agents/")]
    assert shown == [f"    - agents/a{i}.yaml: warning {i}" for i in range(3)]
    assert "    … and 2 more (--verbose, or the gate page)" in lines
    lines = screen(results_gate(), 120, verbose=True)
    assert len([line for line in lines if line.startswith("    - agents/")]) == 5
    assert not any("more (--verbose" in line for line in lines)
    three = results_gate(warnings=results_gate()["warnings"][:3])
    assert not any("more (--verbose" in line for line in screen(three, 120))


def test_a_passed_gate_ends_with_a_tick_and_no_failure_sections() -> None:
    answer = gate("passed", [case("adds", passed=True), case("two", passed=True)], html_url=URL)
    lines = [line for line in screen(answer, 80) if line.strip()]
    assert lines[-2:] == [f"  ✓ 2/2 cases passed.  gate {GATE_ID}: PASSED", f"  {URL}"]
    text = "\n".join(lines)
    for absent in ("First failure", "Failure details", "Failures by cause", "✗"):
        assert absent not in text


def test_an_error_gates_own_reason_and_problems_show_when_no_case_failed() -> None:
    answer = gate(
        "error",
        [],
        failure_reason="2 suite(s) are invalid",
        problems=[{"file": "tests/x.yaml", "message": "unknown agent 'ghost'"}],
    )
    lines = [line for line in screen(answer, 80) if line.strip()]
    assert lines == [
        "  error: 2 suite(s) are invalid",
        "    - tests/x.yaml: unknown agent 'ghost'",
        f"  ✗ 0/0 cases passed.  gate {GATE_ID}: ERROR",
    ]


def test_bundle_text_in_the_new_sections_cannot_reach_the_terminal_as_escapes() -> None:
    evil = "x\x1b[2J[bold]y[/bold]\x07"
    hostile = case(evil, passed=False, reason=SENTENCE + RESULT_FALSE + evil)
    hostile["failed_runs"] = {"total_failed": 1, "shown": [{
        "run_id": evil, "error": evil,
        "traces": [span("s", None, 1, "error", "tool", tool_name=evil, error=evil)],
    }]}  # fmt: skip
    answer = gate("failed", [hostile], html_url=URL + evil, warnings=[{"message": evil}])
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=True, record=True)
    for verbose in (False, True):
        render_results(console, answer, verbose=verbose)
    out = buffer.getvalue()  # rich's own colours are escapes; the bundle's are not
    assert "\x1b[2J" not in out and "\x07" not in out
    shown = console.export_text()
    # Each place it is printed: the first failure, the span, the group, the table, the URL...
    assert shown.count("x\\x1b[2J[bold]y[/bold]\\x07") >= 8


# -- progress ------------------------------------------------------------------------------


def gate_at(status: str, phase: str | None, judged: int = 0, total: int = 0) -> GateView:
    cases = [case(f"c{i}", passed=True) for i in range(judged)]
    cases += [case(f"q{i}", passed=None, status="queued") for i in range(total - judged)]
    return GateView.of({**gate(status, cases), "phase": phase, "total_cases": total})


def test_progress_lines_say_where_the_gate_stands() -> None:
    assert progress_line(gate_at("queued", "queued")) == "Queued: waiting for a worker"
    assert progress_line(gate_at("queued", None)) == "Queued: waiting for a worker"
    assert progress_line(gate_at("running", "queued")) == "Queued: waiting for a worker"
    assert progress_line(gate_at("running", "validating")) == "Validating uploaded files..."
    assert progress_line(gate_at("running", "running_tests", 1, 2)) == (
        "Running test cases... 1 of 2 cases judged"
    )
    assert progress_line(gate_at("running", "a_new_phase")) == "a_new_phase"
    assert progress_line(gate_at("failed", "done", 2, 2)) == "Finished: failed"


def test_plain_progress_prints_each_change_once() -> None:
    buffer = io.StringIO()
    progress = GateProgress(Console(file=buffer, width=80))  # a CI log: no terminal
    states = [
        gate_at("queued", "queued"),
        gate_at("queued", "queued"),
        gate_at("running", "queued"),
        gate_at("running", "validating"),
        gate_at("running", "running_tests", 0, 2),
        gate_at("running", "running_tests", 1, 2),
        gate_at("running", "running_tests", 1, 2),
        gate_at("running", "running_tests", 2, 2),
        gate_at("passed", "done", 2, 2),
    ]
    with progress.running():
        for state in states:
            progress.update(state)
    assert buffer.getvalue().splitlines() == [
        "Queued: waiting for a worker",
        "Validating uploaded files...",
        "Running test cases... 0 of 2 cases judged",
        "Running test cases... 1 of 2 cases judged",
        "Running test cases... 2 of 2 cases judged",
        "Finished: passed",
    ]
    assert "queued: queued" not in buffer.getvalue().lower()


def test_the_live_bar_says_queued_in_words_too() -> None:
    buffer = io.StringIO()
    progress = GateProgress(Console(file=buffer, force_terminal=True, width=100))
    with progress.running():
        progress.update(gate_at("queued", "queued"))
    assert "Queued: waiting for a worker" in buffer.getvalue()


# -- through the CLI -----------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return calculator_project(tmp_path / "p", failing=False)


def test_submit_verbose_fetches_and_shows_every_failed_run(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failing = [
        case("one", passed=False, reason=SENTENCE + RESULT_FALSE, runs=1),
        case("two", passed=False, reason=SENTENCE + SCHEMA, runs=1),
    ]
    fake = FakeGate([gate("running", []), gate("failed", failing, html_url=URL)])
    use_api(fake)
    code, out, _ = run_cli(capsys, str(project))
    fetched = [r.url.path for r in fake.requests if r.url.path.startswith("/v1/runs/")]
    assert code == 1 and fetched == ["/v1/runs/run-one-0"]  # the one run it shows
    assert "→ First failure: calc::one" in out and "Run run-two-0" not in out
    assert [line for line in out.splitlines() if line.strip()][-1] == f"  {URL}"
    fake = FakeGate([gate("running", []), gate("failed", failing, html_url=URL)])
    use_api(fake)
    code, out, _ = run_cli(capsys, str(project), "-v")
    fetched = [r.url.path for r in fake.requests if r.url.path.startswith("/v1/runs/")]
    assert code == 1 and fetched == ["/v1/runs/run-one-0", "/v1/runs/run-two-0"]
    assert "→ Failure details:" in out and "Run run-one-0" in out and "Run run-two-0" in out


def test_a_bundles_huge_numbers_and_a_redacting_guardrail_read_plainly() -> None:
    """A span's duration and cost are the bundle's own JSON numbers: one past float's range
    reads as "—" instead of crashing the summary; a guardrail that masked text went well."""
    huge = span("h", None, 1, "ok", "step")
    huge["duration_ms"] = 10**400
    redacted = span("r", None, 2, "redacted", "guard:pii", message="masked 2 emails")
    lines = [str(line) for line in trace_lines([huge, redacted], indent=0)]
    assert lines == ["✓ step (—)", "✓ pii REDACTED (7 ms)"]
    # Neither is on a failing path: nothing went wrong.
    assert trace_lines([huge, redacted], indent=0, failing_path=True) == []
    assert money(10**400) == duration(10**400) == "—"
    assert money(float("nan")) == "—" and money(5e-324) == "$0.00"


class LackingScope(FakeGate):
    """A gate whose token check answers 403: a read-only token of project shop."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/whoami":
            self.requests.append(request)
            problem = {"project": "shop", "scopes": ["read"], "needed": "submit"}
            body = {"error": "Forbidden", "detail": "lacks submit", "problems": [problem]}
            return httpx.Response(403, json=body)
        return super().__call__(request)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_refused_token_names_itself_whole_at_each_width(
    width: int,
    monkeypatch: pytest.MonkeyPatch,
    use_api: Callable[[FakeGate], None],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Item 6 on a terminal of ``width`` columns: the refusal names the token's prefix, what
    it lacks and GATE_TOKEN, soft-wrapped (no word cut), and nothing was packed or sent."""
    monkeypatch.setenv("COLUMNS", str(width))
    fake = LackingScope([])
    use_api(fake)
    project = calculator_project(tmp_path / "p", failing=False)
    code = main(
        ["submit", str(project), "--url", "http://gate.test", "--token", "gate_abcdef0123456789"]
    )
    _, err = capsys.readouterr()
    said = " ".join(err.split())  # the sentence, whatever the wrapping
    assert code == 2
    assert "the token gate_abc… of project shop lacks the submit scope: it holds read" in said
    assert "GATE_TOKEN" in said
    assert [(r.method, r.url.path) for r in fake.requests] == [("GET", "/v1/whoami")]

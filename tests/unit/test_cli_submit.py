"""`gate submit` against a scripted API: rendering, --json, exit codes, labels, progress."""

from __future__ import annotations

import io
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from gate_service.cli import main
from gate_service.cli.submit import parse_labels
from gate_service.client import api
from gate_service.client.render import (
    GateProgress,
    failed_run_lines,
    render_results,
    trace_lines,
    truncate,
)
from tests.fixtures.projects import calculator_project

REAL_CLIENT = api.GateClient
GATE_ID = "0b6f3c1e-0000-4000-8000-000000000001"


def case(
    name: str,
    *,
    passed: bool | None,
    status: str | None = None,
    reason: str | None = None,
    runs: int = 2,
    successes: int | None = None,
    run_passed: list[bool] | None = None,
    suite: str = "tests/calc.yaml",
) -> dict[str, Any]:
    run_passed = run_passed if run_passed is not None else [bool(passed)] * runs
    return {
        "id": f"case-{name}",
        "suite": suite,
        "agent_name": "calc",
        "test_name": name,
        "status": status or ("passed" if passed else "failed"),
        "passed": passed,
        "successes": successes if successes is not None else sum(run_passed),
        "runs": runs,
        "success_threshold": 100,
        "duration_ms": 1500,
        "failure_reason": reason,
        "agent_run_ids": [f"run-{name}-{i}" for i in range(runs)],
        "agent_run_passed": run_passed,
    }


def gate(status: str, cases: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": GATE_ID,
        "status": status,
        "phase": "done" if status not in ("queued", "running") else "running_tests",
        "total_cases": len(cases),
        "failure_reason": extra.pop("failure_reason", None),
        "error": None,
        "problems": extra.pop("problems", []),
        "labels": {},
        "cases": cases,
        **extra,
    }


SPANS: list[dict[str, Any]] = [
    # Out of order on purpose: the tree must sort by span_order under each parent.
    {"span_id": "c2", "parent_span_id": "root", "span_order": 3, "type": "tool_call",
     "name": "tool_call", "status": "error", "duration_ms": 7,
     "metadata": {"tool_name": "math_ops.double", "error": "KeyError: 'sum'"}},
    {"span_id": "root", "parent_span_id": None, "span_order": 1, "type": "agent",
     "name": "calc", "status": "error", "duration_ms": 20, "metadata": {}},
    {"span_id": "log1", "parent_span_id": "root", "span_order": 2, "type": "log",
     "name": "stdout", "status": "ok", "duration_ms": 0, "metadata": {}},
    {"span_id": "c1", "parent_span_id": "root", "span_order": 2, "type": "tool_call",
     "name": "tool_call", "status": "ok", "duration_ms": 5,
     "metadata": {"tool_name": "math_ops.add"}},
]  # fmt: skip


def run_body(run_id: str) -> dict[str, Any]:
    return {
        "id": run_id,
        "status": "failed",
        "passed": False,
        "input": {"a": 2, "b": 2},
        "output": {"sum": 4},
        "error": "expected_result failed: output.sum == 5",
        "run_context": {"seen": "x" * 900},
        "traces": SPANS,
    }


class FakeGate:
    """A scripted API: POST /v1/gates, then GET /v1/gates/{id} answers ``states`` in turn."""

    def __init__(self, states: list[dict[str, Any]], submit_status: int = 202) -> None:
        self.states = states
        self.submit_status = submit_status
        self.requests: list[httpx.Request] = []
        self.polls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path == "/v1/whoami":  # the token check before packing: a submit+read token
            token = {"id": GATE_ID, "name": None, "scopes": ["read", "submit"]}
            return httpx.Response(200, json={"project": "shop", "token": token})
        if request.method == "POST" and path == "/v1/gates":
            if self.submit_status != 202:
                body = {"error": "Unauthorized", "detail": "the token was revoked"}
                return httpx.Response(self.submit_status, json=body)
            return httpx.Response(202, json=gate("queued", []))
        if path == f"/v1/gates/{GATE_ID}":
            state = self.states[min(self.polls, len(self.states) - 1)]
            self.polls += 1
            return httpx.Response(200, json=state, headers={"ETag": f'"{self.polls}"'})
        if path.startswith("/v1/runs/"):
            return httpx.Response(200, json=run_body(path.rsplit("/", 1)[1]))
        return httpx.Response(404, json={"error": "NotFound", "detail": path})


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return calculator_project(tmp_path / "p", failing=False)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["submit", *argv, "--url", "http://gate.test", "--token", "t"])
    out, err = capsys.readouterr()
    return code, out, err


FAILED = gate(
    "failed",
    [
        case("adds", passed=True),
        case(
            "wrong_sum",
            passed=False,
            reason="1/5 runs passed; 100% needed",
            runs=5,
            run_passed=[False, True, False, False, False],
        ),
    ],
    failure_reason="1 of 2 cases failed",
)
PASSED = gate("passed", [case("adds", passed=True)])
ERRORED = gate(
    "error",
    [],
    failure_reason="2 suite(s) are invalid",
    problems=[{"file": "tests/x.yaml", "message": "unknown agent 'ghost'"}],
)
CANCELLED = gate(
    "cancelled", [case("adds", passed=None, status="cancelled", reason="the gate was cancelled")]
)


@pytest.mark.parametrize(
    ("final", "code"), [(PASSED, 0), (FAILED, 1), (CANCELLED, 1), (ERRORED, 2)]
)
def test_exit_codes_follow_the_verdict(
    final: dict[str, Any],
    code: int,
    use_api: Callable[[FakeGate], None],
    project: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    use_api(FakeGate([gate("running", []), final]))
    got, _, _ = run_cli(capsys, str(project))
    assert got == code


def test_json_is_the_format_clis_shape_with_failed_runs(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeGate([gate("running", []), FAILED])
    use_api(fake)
    code, out, _ = run_cli(capsys, str(project), "--json", "--label", "commit=abc")
    assert code == 1
    result = json.loads(out)  # stdout is the JSON document and nothing else
    assert result["status"] == "failed" and result["test_run_id"] == GATE_ID
    failing = result["cases"][1]
    assert failing["failed_runs"]["total_failed"] == 4
    shown = failing["failed_runs"]["shown"]
    assert [r["run_id"] for r in shown] == ["run-wrong_sum-0", "run-wrong_sum-2", "run-wrong_sum-3"]
    assert shown[0]["error"] == "expected_result failed: output.sum == 5"
    spans = shown[0]["traces"]
    assert "log1" not in {s["span_id"] for s in spans}  # log spans are dropped
    assert json.loads(spans[0]["metadata_json"])["tool_name"] == "math_ops.double"
    assert "failed_runs" not in result["cases"][0]
    fetched = [r.url.path for r in fake.requests if r.url.path.startswith("/v1/runs/")]
    assert len(fetched) == 3
    posted = next(r for r in fake.requests if r.method == "POST")
    assert b'{"commit": "abc"}' in posted.content


def test_json_on_error_prints_nothing_and_says_why_on_stderr(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    use_api(FakeGate([ERRORED]))
    code, out, err = run_cli(capsys, str(project), "--json")
    assert (code, out) == (2, "")
    assert "Gate errored: 2 suite(s) are invalid" in err and "unknown agent 'ghost'" in err


def test_an_error_gates_unjudged_case_shows_its_failed_runs(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A case a provider failure left unjudged (docs/semantics.md, "Provider failures are not agent
    failures") has runs whose traces say why: they are fetched and shown as a failed case's."""
    reason = "1 of 1 invocation(s) could not be judged, because a model call failed"
    unjudged = case("wrong_sum", passed=None, status="error", reason=reason, runs=1)
    use_api(FakeGate([gate("error", [unjudged], failure_reason=f"1 of 1 case(s): {reason}")]))
    code, out, err = run_cli(capsys, str(project))
    assert code == 2
    assert "→ First failure: calc::wrong_sum" in out, out
    assert "Spans on the way (run run-wrong_sum-0):" in out, out
    assert "Gate errored" in err
    use_api(FakeGate([gate("error", [unjudged], failure_reason=f"1 of 1 case(s): {reason}")]))
    code, out, err = run_cli(capsys, str(project), "--verbose")
    assert code == 2
    assert "Run run-wrong_sum-0" in out, out


def test_json_on_cancel_prints_the_document(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    use_api(FakeGate([CANCELLED]))
    code, out, _ = run_cli(capsys, str(project), "--json")
    assert code == 1 and json.loads(out)["status"] == "cancelled"


def test_human_output_has_table_details_and_summary(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    use_api(FakeGate([gate("running", []), FAILED]))
    code, out, _ = run_cli(capsys, str(project))
    assert code == 1
    for header in ("Result", "Test", "Runs", "Threshold"):
        assert header in out
    assert "calc::wrong_sum" in out and "1/5" in out and "100%" in out
    # Without --verbose: the first failed run, collapsed to its check and failing spans.
    assert "→ First failure: calc::wrong_sum\n    1/5 runs passed; 100% needed\n" in out
    assert "Spans on the way (run run-wrong_sum-0):" in out and "Failure details" not in out
    assert "1/2 cases passed." in out
    assert out.index("First failure") < out.index("1/2 cases passed.")
    use_api(FakeGate([gate("running", []), FAILED]))
    code, out, _ = run_cli(capsys, str(project), "--verbose")
    assert code == 1
    assert "calc::wrong_sum: 1/5 runs passed; 100% needed" in out
    assert "Run run-wrong_sum-0" in out and "… and 1 more failed run(s) not shown" in out
    assert "1/2 cases passed." in out
    assert out.index("Failure details") < out.index("1/2 cases passed.")


def test_refused_submission_and_unreachable_gate_exit_2(
    use_api: Callable[[Callable[..., httpx.Response]], None],
    project: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    use_api(FakeGate([PASSED], submit_status=401))
    code, _, err = run_cli(capsys, str(project))
    assert code == 2 and "401 Unauthorized: the token was revoked" in err

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    use_api(down)
    code, _, err = run_cli(capsys, str(project))
    assert code == 2 and "cannot reach the gate at http://gate.test" in err


def test_refused_pack_exits_2_before_any_upload(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeGate([PASSED])
    use_api(fake)
    (project / "tools/app.exe").write_bytes(b"MZ")
    code, out, err = run_cli(capsys, str(project), "--json")
    assert (code, out) == (2, "")
    assert "tools/app.exe: File type '.exe' not allowed" in err
    # Only the token check went out (it comes before packing); nothing was uploaded.
    assert [(r.method, r.url.path) for r in fake.requests] == [("GET", "/v1/whoami")]


def test_no_wait_exits_0_once_queued(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeGate([FAILED])
    use_api(fake)
    code, out, _ = run_cli(capsys, str(project), "--no-wait")
    assert code == 0 and f"gate {GATE_ID} queued" in out and fake.polls == 0


def test_waits_by_default(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeGate([FAILED])
    use_api(fake)
    code, _, _ = run_cli(capsys, str(project))
    assert code == 1 and fake.polls == 1


def test_label_parsing() -> None:
    assert parse_labels(["commit=abc", "branch=main", "empty=", "eq=a=b"]) == {
        "commit": "abc",
        "branch": "main",
        "empty": "",
        "eq": "a=b",
    }
    assert parse_labels(None) == {}


@pytest.mark.parametrize("bad", ["nokey", "=value", " =x"])
def test_a_bad_label_is_a_usage_error(
    bad: str, use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeGate([PASSED])
    use_api(fake)
    code, _, err = run_cli(capsys, str(project), "--label", bad)
    assert code == 2 and "--label" in err and "key=value" in err
    assert fake.requests == []


def test_plain_progress_lines_off_a_terminal(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    running = gate(
        "running", [case("adds", passed=True), case("two", passed=None, status="queued")]
    )
    running["phase"] = "running_tests"
    use_api(FakeGate([gate("running", []), running, running, PASSED]))
    code, out, _ = run_cli(capsys, str(project))
    assert code == 0
    assert "\nRunning test cases... 1 of 2 cases judged\n" in out
    assert out.count("1 of 2 cases judged") == 1  # one line per change, not per poll
    assert "\x1b[" not in out  # not a terminal: no colour, no live bar


def test_a_live_bar_on_a_terminal() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    progress = GateProgress(console)
    with progress.running():
        state = gate(
            "running", [case("adds", passed=True), case("b", passed=None, status="running")]
        )
        state["phase"] = "running_tests"
        progress.update(state)
    assert "1/2" in buffer.getvalue() and "Running test cases" in buffer.getvalue()
    assert "\x1b[" in buffer.getvalue()


def test_quiet_progress_prints_nothing() -> None:
    buffer = io.StringIO()
    progress = GateProgress(Console(file=buffer, force_terminal=True), quiet=True)
    with progress.running():
        progress.update(gate("running", []))
    assert buffer.getvalue() == ""


def plain(lines: list[Any]) -> list[str]:
    return [str(line) for line in lines]


def test_span_tree_nests_children_in_order_with_inline_errors() -> None:
    spans = [s for s in SPANS if s["type"] != "log"]
    lines = plain(trace_lines(spans, indent=2))
    assert lines == [
        "  ✗ calc FAILED (20 ms)",
        "    ✓ math_ops.add (5 ms)",
        "    ✗ math_ops.double FAILED (7 ms) — KeyError: 'sum'",
    ]


def test_span_tree_reads_the_format_clis_metadata_json_too() -> None:
    spans = [
        {"span_id": "a", "span_order": 2, "name": "x", "status": "ok", "duration_ms": 1,
         "metadata_json": '{"tool_name": "second"}'},
        {"span_id": "b", "span_order": 1, "name": "y", "status": "error", "duration_ms": 2,
         "metadata_json": '{"error": "boom"}'},
        {"span_id": "c", "parent_span_id": "missing", "span_order": 0, "name": "orphan",
         "status": "ok", "duration_ms": None, "metadata_json": "not json"},
    ]  # fmt: skip
    assert plain(trace_lines(spans, indent=0)) == [
        "✓ orphan",
        "✗ y FAILED (2 ms) — boom",
        "✓ second (1 ms)",
    ]


def test_run_fields_are_cut_to_800_characters() -> None:
    assert truncate("x" * 800) == "x" * 800
    assert truncate("x" * 801) == "x" * 800 + "…[1 more character]"
    detail = {
        "total_failed": 1,
        "shown": [{**run_body("r1"), "run_id": "r1", "output": "o" * 2000}],
    }
    text = "\n".join(plain(failed_run_lines(detail)))
    assert "o" * 800 + "…[1,200 more characters]" in text and "o" * 801 not in text
    # {"seen": "x" * 900} is 912 characters of JSON.
    assert "Context: " in text and "…[112 more characters]" in text.split("Context: ")[1]


def test_bundle_text_cannot_reach_the_terminal_as_escapes() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=120)
    hostile = case("evil\x1b[2J[bold]x[/bold]", passed=False, reason="bad\x1b]0;title\x07")
    render_results(console, gate("failed", [hostile]))
    out = buffer.getvalue()
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2J[bold]x[/bold]" in out  # shown literally, markup not interpreted


def test_an_answer_not_of_its_types_reads_as_missing_and_json_keeps_it_as_sent() -> None:
    from gate_service.client.render import json_result
    from gate_service.client.shapes import FailedRuns, GateView

    odd = case("odd", passed=None, status="error")
    odd.update(passed="yes", runs="many", agent_run_ids=None, extra={"kept": True})
    answer = gate("error", [odd], labels=["not", "a", "dict"], model_calls="none")
    view = GateView.of(answer)
    (read,) = view.cases
    assert (read.passed, read.runs, read.agent_run_ids, read.extra) == (
        None,
        None,
        [],
        {"kept": True},
    )
    assert view.labels == {} and view.model_calls is None
    buffer = io.StringIO()
    render_results(Console(file=buffer, width=120), view)
    assert " ERROR " in buffer.getvalue() and "1/None" not in buffer.getvalue()
    # --json: the case as the service sent it, its failed runs (a typed attribute) added.
    read.failed_runs = FailedRuns.of({"total_failed": 0, "shown": []})
    assert json_result(view)["cases"] == [{**odd, "failed_runs": {"total_failed": 0, "shown": []}}]


def test_failed_runs_that_cannot_load_say_so() -> None:
    detail = {"total_failed": 1, "shown": [{"run_id": "r9", "fetch_error": "HTTP 404"}]}
    assert plain(failed_run_lines(detail)) == ["      Run r9 (could not load: HTTP 404)"]


def test_an_archive_is_sent_as_it_is(
    use_api: Callable[[FakeGate], None],
    project: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gate_service.client.pack import pack_project

    archive = tmp_path / "bundle.tgz"
    archive.write_bytes(pack_project(project))
    fake = FakeGate([PASSED])
    use_api(fake)
    code, _, _ = run_cli(capsys, str(archive))
    posted = next(r for r in fake.requests if r.method == "POST")
    assert code == 0 and b'filename="bundle.tgz"' in posted.content
    assert archive.read_bytes() in posted.content


def test_waiting_retries_network_errors_then_gives_up() -> None:
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise httpx.ReadError("reset", request=request)
        return httpx.Response(200, json=PASSED)

    client = REAL_CLIENT("http://gate.test", transport=httpx.MockTransport(flaky))
    assert client.wait(GATE_ID, retry_delay_s=0)["status"] == "passed"
    assert calls["n"] == 3

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = REAL_CLIENT("http://gate.test", transport=httpx.MockTransport(down))
    with pytest.raises(httpx.ConnectError):
        client.wait(GATE_ID, retry_delay_s=0, network_retries=3)


def test_a_gate_that_does_not_finish_in_time_exits_2(
    use_api: Callable[[FakeGate], None],
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = itertools.count(0.0, 1000.0)
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))  # no real waiting
    use_api(FakeGate([gate("running", [])]))
    code, _, err = run_cli(capsys, str(project), "--timeout", "1500")
    assert code == 2 and "did not finish within 1500 s" in err


def test_a_passed_gates_warnings_are_printed_and_in_the_json(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    warned = gate("passed", [case("adds", passed=True)])
    warned["warnings"] = [
        {
            "file": "agents/calc.yaml",
            "agent": "calc",
            "key": "session",
            "support": "not_in_gate",
            "message": "session is not in a gate: no session persists\x1b[2J",
        }
    ]
    use_api(FakeGate([gate("running", []), warned]))
    code, out, _ = run_cli(capsys, str(project))
    assert code == 0
    assert "⚠ 1 warning(s)" in out
    assert "agents/calc.yaml (agent calc): session is not in a gate" in out
    assert "\x1b" not in out
    assert out.index("warning(s)") < out.index("1/1 cases passed.")
    use_api(FakeGate([gate("running", []), warned]))
    code, out, _ = run_cli(capsys, str(project), "--json")
    assert code == 0 and json.loads(out)["warnings"] == warned["warnings"]


# A model span's recorded request (issue 38, item 8), as the runner records it.
REQUEST: dict[str, Any] = {
    "system_prompt": "You add.\nNothing else.",
    "messages": [
        {"role": "user", "content": "add 2 and 2"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "4\x1b[2J"},
    ],
    "messages_dropped": 1,
    "tools": [{"name": "add", "description": "Adds.", "parameters": {"type": "object"}}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "sum", "schema": {}}},
}  # fmt: skip
MODEL_SPAN: dict[str, Any] = {
    "span_id": "m1", "parent_span_id": "root", "span_order": 4, "type": "model_call",
    "name": "openai/gpt-4o", "status": "ok", "duration_ms": 3,
    "metadata": {"mode": "scripted", "request": REQUEST},
}  # fmt: skip


def test_a_model_spans_request_is_one_line_and_in_full_with_show_requests() -> None:
    spans = [SPANS[1], MODEL_SPAN]
    assert plain(trace_lines(spans, indent=2)) == [
        "  ✗ calc FAILED (20 ms)",
        "    ✓ openai/gpt-4o (3 ms)",
        "      request: 4 messages (1 not kept), 1 tool, response_format json_schema",
    ]
    full = plain(trace_lines(spans, indent=2, show_requests=True))
    assert full[2:] == [
        "      request: 4 messages (1 not kept), 1 tool, response_format json_schema",
        "        [system] You add.",
        "            Nothing else.",
        "        … 1 older message(s) not kept",
        "        [user] add 2 and 2",
        '        [assistant] → add({"a": 2, "b": 2})',
        "        [tool add] 4\\x1b[2J",
        '        tool add {"type": "object"}',
        '        response_format {"type": "json_schema", "json_schema": {"name": "sum", '
        '"schema": {}}}',
    ]
    # A request kept as counts alone says so; what is not a request shows no line.
    counted = {"messages_dropped": 3, "tools_dropped": 2, "response_format": None,
               "omitted": "the invocation keeps its latest model requests"}  # fmt: skip
    for request, line in [
        (counted, "request: 3 messages, 2 tools (content not kept)"),
        ({"messages": "x", "tools_dropped": True}, "request: 0 messages, 0 tools"),
    ]:
        spans = [{**MODEL_SPAN, "metadata": {"request": request}}]
        assert plain(trace_lines(spans, indent=0))[1:] == ["  " + line]
    assert len(trace_lines([{**MODEL_SPAN, "metadata": {"request": "text"}}], indent=0)) == 1


class ModelSpanGate(FakeGate):
    """The scripted API, its failed runs' traces holding a model span with its request (one
    that ended ``model_status``)."""

    def __init__(self, states: list[dict[str, Any]], model_status: str = "ok") -> None:
        super().__init__(states)
        self.model_status = model_status

    def __call__(self, request: httpx.Request) -> httpx.Response:
        answer = super().__call__(request)
        if request.url.path.startswith("/v1/runs/"):
            run = run_body(request.url.path.rsplit("/", 1)[1])
            model = {**MODEL_SPAN, "status": self.model_status}
            return httpx.Response(200, json={**run, "traces": [*SPANS, model]})
        return answer


def test_submit_shows_requests_in_full_only_with_the_flag(
    use_api: Callable[[FakeGate], None], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = "request: 4 messages (1 not kept), 1 tool, response_format json_schema"
    use_api(ModelSpanGate([gate("running", []), FAILED]))
    code, out, _ = run_cli(capsys, str(project), "--verbose")
    assert code == 1
    assert out.count(summary) == 3
    assert "[user] add 2 and 2" not in out
    use_api(ModelSpanGate([gate("running", []), FAILED]))
    code, out, _ = run_cli(capsys, str(project), "--verbose", "--show-requests")
    assert code == 1
    assert out.count("[user] add 2 and 2") == 3 and "[system] You add." in out
    assert "\x1b" not in out
    # Without --verbose: a model span that passed is off the first failure's failing path;
    # one that failed is on it, its request in full with the flag.
    use_api(ModelSpanGate([gate("running", []), FAILED]))
    code, out, _ = run_cli(capsys, str(project), "--show-requests")
    assert code == 1 and summary not in out
    use_api(ModelSpanGate([gate("running", []), FAILED], model_status="error"))
    code, out, _ = run_cli(capsys, str(project))
    assert code == 1 and out.count(summary) == 1 and "[user] add 2 and 2" not in out
    use_api(ModelSpanGate([gate("running", []), FAILED], model_status="error"))
    code, out, _ = run_cli(capsys, str(project), "--show-requests")
    assert code == 1 and out.count("[user] add 2 and 2") == 1 and "\x1b" not in out

"""The runner judging whole cases in-process (forked invocations, no Docker)."""

import base64
from pathlib import Path

import pytest

from gate_runner.__main__ import main as runner_main
from gate_service.runner_contract import parse_runner_output
from tests.fixtures.projects import calculator_project, unknown_agent_project
from tests.fixtures.runner import judged, overlaps


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return calculator_project(tmp_path / "proj", failing=True)


def test_passing_case_counts_every_run(project: Path) -> None:
    result = judged(project, "tests/calc.yaml", "adds_two_numbers")
    assert (result.passed, result.successes, result.runs) == (True, 2, 2)
    assert result.failure_reason is None
    inv = result.invocations[0]
    assert inv.output == {"sum": 5}
    assert inv.input == {"a": 2, "b": 3}
    tool_spans = [s for s in inv.traces if s.type == "tool_call"]
    assert tool_spans[0].metadata["tool_ref"] == "math_ops.add"
    logs = [s.metadata["message"] for s in inv.traces if s.type == "log"]
    assert logs == ["adding 2 3"]


def test_failing_case_reason_names_assertion_value_and_count(project: Path) -> None:
    result = judged(project, "tests/calc-wrong.yaml", "expects_the_wrong_sum")
    assert (result.passed, result.successes) == (False, 0)
    assert result.failure_reason is not None
    assert "2 of 2 invocation(s) failed" in result.failure_reason
    assert "`output.sum == 5`" in result.failure_reason
    assert "output.sum = 4" in result.failure_reason


@pytest.mark.slow
def test_timeout_is_a_failed_status_with_timed_out_in_error(project: Path) -> None:
    result = judged(project, "tests/calc.yaml", "slow_call_times_out")
    assert result.passed
    inv = result.invocations[0]
    assert inv.status == "failed"
    # Killed at timeout_s, not after the 30 s sleep; the error names the limit that fired.
    assert inv.error is not None and "timed out after" in inv.error and "(timeout_s)" in inv.error


@pytest.mark.slow
@pytest.mark.parametrize(
    ("suite", "case", "passes"),
    [
        ("tests/flaky-lenient.yaml", "two_of_three_at_66_percent", True),
        ("tests/flaky.yaml", "two_of_three_at_67_percent", False),
    ],
)
def test_threshold_is_exact_over_real_invocations(
    project: Path, tmp_path: Path, suite: str, case: str, passes: bool
) -> None:
    suite_path = project / suite
    suite_path.write_text(
        suite_path.read_text().replace('{"counter"', f'{{"dir": "{tmp_path}", "counter"')
    )
    result = judged(
        project, suite, case, fresh=lambda: [c.unlink() for c in tmp_path.glob("flaky-*")]
    )
    assert result.successes == 2
    assert result.passed is passes


def test_sequential_chain_passes_values_between_stages(project: Path) -> None:
    result = judged(project, "tests/pipeline.yaml", "adds_then_doubles")
    assert result.passed, result.failure_reason
    assert result.invocations[0].output == {"value": 6}


def test_unknown_agent_is_a_case_error_naming_suite_and_agent(tmp_path: Path) -> None:
    project = unknown_agent_project(tmp_path / "p")
    result = judged(project, "tests/ghost.yaml", "talks_to_nobody", judgeable=False)
    assert result.case_error is not None
    assert "tests/ghost.yaml" in result.case_error and "'ghost'" in result.case_error


def test_cli_prints_one_marked_document(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = runner_main(
        [
            "run-case",
            "--project",
            str(project),
            "--suite",
            "tests/calc.yaml",
            "--case",
            "adds_two_numbers",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    result = parse_runner_output(out.encode())
    assert result.passed and result.test_name == "adds_two_numbers"


def test_nul_bytes_in_results_are_made_storable() -> None:
    from gate_service.runner_contract import without_nul

    assert without_nul({"a\x00": ["x\x00y", 1, None]}) == {"a\ufffd": ["x\ufffdy", 1, None]}


def test_large_fixtures_are_shortened_in_the_stored_result(tmp_path: Path) -> None:
    project = calculator_project(tmp_path / "proj", failing=False)
    (project / "tests/files").mkdir(parents=True)
    (project / "tests/files/big.bin").write_bytes(b"\x01" * 300_000)
    (project / "tests/big.yaml").write_text(
        'agent: calc\ntests:\n  - name: with_fixture\n    payload: \'{"a": 1, "b": 1}\'\n'
        "    files: [big.bin]\n    runs: 3\n    expected_result: output.sum == 2\n"
    )
    result = judged(project, "tests/big.yaml", "with_fixture")
    assert result.passed
    stored = result.invocations[0].input["files"][0]["data"]
    # Base64 of the fixture: its first 1 KiB kept, the rest counted in the service's mark.
    whole = base64.b64encode(b"\x01" * 300_000).decode()
    assert stored == f"{whole[:1024]}…[{len(whole) - 1024} bytes cut]"
    assert len(result.to_json()) < 200_000


@pytest.mark.slow
def test_invocations_run_concurrently_up_to_max_concurrent_runs_without_sharing_state(
    tmp_path: Path,
) -> None:
    from tests.fixtures.projects import write

    marks = tmp_path / "marks"
    marks.mkdir()
    project = write(
        tmp_path / "p",
        {
            "agents/parallel.yaml": """
            version: "1.0"
            name: parallel
            description: Sleeps, and counts its calls in module state.
            type: tool
            tool_name: slow.work
            max_concurrent_runs: 4
        """,
            "agents/serial.yaml": """
            version: "1.0"
            name: serial
            description: The same, with the default of one run at a time.
            type: tool
            tool_name: slow.work
        """,
            "tools/slow.py": f"""
            import os
            import time

            CALLS = []


            def work(payload: dict) -> dict:
                CALLS.append(1)
                start = time.time()
                time.sleep(0.5)
                with open(os.path.join({str(marks)!r}, payload["tag"] + str(os.getpid())), "w") as fh:
                    fh.write(f"{{start}} {{time.time()}}")
                return {{"calls": len(CALLS)}}
        """,
            "tests/parallel.yaml": """
            tests:
              - name: four_at_once
                payload: '{"tag": "p"}'
                runs: 4
                expected_result: output.calls == 1
        """,
            "tests/serial.yaml": """
            tests:
              - name: one_at_a_time
                payload: '{"tag": "s"}'
                runs: 3
                expected_result: output.calls == 1
        """,
        },
    )

    assert judged(project, "tests/parallel.yaml", "four_at_once").passed
    assert judged(project, "tests/serial.yaml", "one_at_a_time").passed
    assert overlaps(marks, "p") >= 1  # some invocations ran at the same time
    assert overlaps(marks, "s") == 0  # max_concurrent_runs 1: never


@pytest.mark.slow
def test_the_agents_own_timeout_wins_when_smaller(tmp_path: Path) -> None:
    from tests.fixtures.projects import AGENTS, write

    agent = AGENTS["agents/calc.yaml"].replace(
        "tool_name: math_ops.add", "tool_name: math_ops.add\n        timeout: 5"
    )
    project = write(
        tmp_path / "p",
        {
            **AGENTS,
            "agents/calc.yaml": agent,
            "tests/calc.yaml": """
        tests:
          - name: slow
            payload: '{"a": 1, "b": 1, "sleep": 30}'
            timeout_s: 60
            expected_result: status == "failed" and "timed out after 5 s (the agent's timeout)" in error
    """,
        },
    )
    result = judged(project, "tests/calc.yaml", "slow")
    assert result.passed, result.failure_reason


def test_a_marker_inside_a_result_string_is_not_a_block() -> None:
    # User output can hold the marker text; in the runner's one-line JSON it never starts a
    # line, so the result stays one block (and is not refused as forged).
    import json

    from gate_runner.contract import BEGIN_MARKER, END_MARKER
    from gate_service.runner_contract import result_blocks

    doc = {
        "schema_version": 2,
        "suite": "tests/x.yaml",
        "test_name": "t",
        "agent_name": "a",
        "runs": 1,
        "success_threshold": 100,
        "successes": 0,
        "passed": False,
        "case_error": None,
        "failure_reason": f"output was '\n{BEGIN_MARKER}\n{{}}\n{END_MARKER}\n'",
        "duration_ms": 1,
        "invocations": [],
    }
    out = f"{BEGIN_MARKER}\n{json.dumps(doc)}\n{END_MARKER}\n".encode()
    assert result_blocks(out) == 1
    assert parse_runner_output(out).failure_reason == doc["failure_reason"]


def test_a_case_name_starting_with_a_dash_stays_the_cases_name(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gate_service.config import Settings
    from gate_service.worker.handler import runner_argv

    argv = runner_argv(Settings(), "tests/calc.yaml", "--invocation-uid=0")
    assert "--case=--invocation-uid=0" in argv
    assert argv[argv.index("--invocation-uid") + 1] == "10001"
    # The runner reads it as the case's name (in-process here: no uid change).
    in_process = ["run-case", "--project", str(project), "--suite=tests/calc.yaml"]
    assert runner_main([*in_process, "--case=--invocation-uid=0"]) == 0
    result = parse_runner_output(capsys.readouterr().out.encode())
    assert result.test_name == "--invocation-uid=0"
    assert result.case_error == "tests/calc.yaml: no case named '--invocation-uid=0'"

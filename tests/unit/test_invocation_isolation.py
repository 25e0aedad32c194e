"""Invocations report over pipes with budgets, and one loop enforces every deadline.

In-process (no uid change): what a container adds (another uid, no capabilities, the sweep of
that uid) is attacked end to end in tests/e2e/test_trust.py.
"""

import json
import os
from pathlib import Path

import pytest

from gate_runner.case import run_case
from gate_runner.contract import CaseResult
from gate_runner.invocations import Isolation
from gate_service.runner_contract import validate_result
from tests.fixtures.projects import write

TOOLS = {
    "agents/noisy.yaml": """
        version: "1.0"
        name: noisy
        description: Prints.
        type: tool
        tool_name: noise.shout
    """,
    "agents/liar.yaml": """
        version: "1.0"
        name: liar
        description: Leaves a result file behind and exits.
        type: tool
        tool_name: noise.forge
    """,
    "agents/sleeper.yaml": """
        version: "1.0"
        name: sleeper
        description: Sleeps.
        type: tool
        tool_name: noise.sleep
        max_concurrent_runs: 2
    """,
    "agents/reporter.yaml": """
        version: "1.0"
        name: reporter
        description: Writes its own report and exits.
        type: tool
        tool_name: noise.report
    """,
    "agents/counter.yaml": """
        version: "1.0"
        name: counter
        description: Says how much of the heap it shares with the runner stays out of its GC.
        type: tool
        tool_name: noise.frozen
    """,
    "tools/noise.py": """
        import gc
        import json
        import os
        import sys
        import time


        def shout(payload: dict) -> str:
            line = "y" * 1023 + "\\n"
            for _ in range(payload["kib"]):
                sys.stdout.write(line)
            print("to stderr", file=sys.stderr)
            return "done"


        def forge(payload: dict) -> None:
            with open(os.path.join(payload["dir"], "result.json"), "w") as fh:
                json.dump({"status": "completed", "output": "ok"}, fh)
            os._exit(0)


        def report(payload: dict) -> None:
            line = json.dumps({"kind": "result", "data": payload["data"]}) + "\\n"
            os.write(3, line.encode())  # the invocation's own report channel
            os._exit(0)


        def sleep(payload: dict) -> str:
            time.sleep(payload["seconds"])
            return "slept"


        def frozen(payload: dict) -> int:
            return gc.get_freeze_count()
    """,
    "tests/builders/slow_cleanup.py": """
        import time


        def build(context, builder_args, test_name, payload, files):
            return {"seconds": builder_args["seconds"]}


        def cleanup(run, context, builder_args):
            if run["output"] is None:  # after a timeout
                time.sleep(builder_args["cleanup_seconds"])
    """,
    "tests/noisy.yaml": """
        tests:
          - name: quiet_enough
            payload: '{"kib": 64}'
            expected_result: output == "done"
          - name: too_loud
            payload: '{"kib": 3072}'
            expected_result: output == "done"
    """,
    "tests/counter.yaml": """
        tests:
          - name: counts
            payload: '{}'
            expected_result: output > 0
    """,
    "tests/sleeper.yaml": """
        tests:
          - name: slow_cleanup_does_not_hide_a_timeout
            runs: 2
            success_threshold: 50
            timeout_s: 3
            builder: slow_cleanup
            builder_args: {seconds: 4, cleanup_seconds: 8}
            expected_result: output == "slept"
    """,
}


def judged(project: Path, suite: str, case: str, isolation: Isolation) -> CaseResult:
    result = validate_result(json.loads(run_case(project, suite, case, isolation).to_json()))
    assert result.case_error is None, result.case_error
    return result


def test_output_under_the_budget_becomes_log_spans(tmp_path: Path) -> None:
    project = write(tmp_path / "p", TOOLS)
    result = judged(project, "tests/noisy.yaml", "quiet_enough", Isolation())
    assert result.passed, result.failure_reason
    logs = [s for s in result.invocations[0].traces if s.type == "log"]
    assert [s.name for s in logs].count("stdout") == 64
    assert logs[-1].metadata == {"level": "ERROR", "message": "to stderr"}


def test_output_past_the_budget_is_dropped_and_fails_saying_so(tmp_path: Path) -> None:
    project = write(tmp_path / "p", TOOLS)
    limit = 1024 * 1024
    result = judged(project, "tests/noisy.yaml", "too_loud", Isolation(output_limit_bytes=limit))
    inv = result.invocations[0]
    assert not result.passed
    assert inv.output == "done"  # the run itself went on: only the printing was cut
    assert inv.failed_assertions == [
        f"the invocation printed more than {limit} bytes (stdout and stderr); the rest was dropped"
    ]


def test_a_result_file_left_behind_is_never_read(tmp_path: Path) -> None:
    project = write(tmp_path / "p", TOOLS)
    (project / "tests/liar.yaml").write_text(
        "tests:\n  - name: forges\n"
        f'    payload: \'{{"dir": "{tmp_path}"}}\'\n'
        '    expected_result: output == "ok"\n'
    )
    result = judged(project, "tests/liar.yaml", "forges", Isolation())
    assert not result.passed
    assert (tmp_path / "result.json").exists()
    assert result.invocations[0].error == (
        "the invocation process exited with code 0 before reporting"
    )


@pytest.mark.slow
def test_a_slow_cleanup_does_not_hide_another_invocations_timeout(tmp_path: Path) -> None:
    # Both invocations run at once and sleep past timeout_s; the first one's late cleanup
    # (8 s) must not keep the loop from killing the second one at its own deadline.
    project = write(tmp_path / "p", TOOLS)
    result = judged(
        project, "tests/sleeper.yaml", "slow_cleanup_does_not_hide_a_timeout", Isolation()
    )
    assert [inv.status for inv in result.invocations] == ["failed", "failed"]
    assert all("timed out after 3 s" in (inv.error or "") for inv in result.invocations)
    assert (result.successes, result.passed) == (0, False)


def reported(tmp_path: Path, data: str) -> CaseResult:
    project = write(tmp_path / "p", TOOLS)
    (project / "tests/reporter.yaml").write_text(
        "tests:\n  - name: reports\n"
        f"    payload: '{{\"data\": {data}}}'\n"
        '    expected_result: status == "completed" and output == "ok"\n'
    )
    return judged(project, "tests/reporter.yaml", "reports", Isolation())


def test_a_malformed_report_fails_its_invocation_not_the_runner(tmp_path: Path) -> None:
    result = reported(tmp_path, '{"status": 5, "traces": [{"span_id": 1}]}')
    assert not result.passed
    assert (result.invocations[0].error or "").startswith("the invocation's report is malformed:")


def test_code_can_lie_about_its_own_invocation_only(tmp_path: Path) -> None:
    # The documented limit (docs/threat-model.md): the invocation process holds its own report
    # channel, so a well-formed report it writes is what its assertions see.
    result = reported(tmp_path, '{"status": "completed", "output": "ok"}')
    assert result.passed, result.failure_reason


def test_a_case_leaves_no_descriptor_of_its_own_open(tmp_path: Path) -> None:
    # The supervisor's selector used to linger until garbage collection; in a forked child
    # its object then closed a descriptor number that had become the report channel.
    import gc

    project = write(tmp_path / "p", TOOLS)
    gc.disable()  # so that only an explicit close can release the descriptors
    try:
        before = set(os.listdir("/proc/self/fd"))
        judged(project, "tests/noisy.yaml", "quiet_enough", Isolation())
        after = set(os.listdir("/proc/self/fd"))
    finally:
        gc.enable()
    assert after <= before, sorted(after - before)


def test_an_invocations_collections_leave_the_runners_heap_alone(tmp_path: Path) -> None:
    # A full collection in a child walks every object it can see, copying each page of the
    # heap it shares with the runner; in a big in-process runner (this pytest process) that
    # cost seconds of the invocation's timeout_s. The heap is frozen for the child only.
    import gc

    project = write(tmp_path / "p", TOOLS)
    held = [[] for _ in range(200_000)]  # tracked objects the runner holds at the fork
    result = judged(project, "tests/counter.yaml", "counts", Isolation())
    assert result.passed, result.failure_reason
    assert result.invocations[0].output >= len(held)
    assert gc.get_freeze_count() == 0  # this process's own collections still see them all


def test_the_sweeps_helper_makes_a_bounded_number_of_kill_all_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kill(-1) succeeds while any process it may not signal is visible (the runner always
    is), so the helper's loop never stops early: it must be short. A loop of 1000 passes
    "until nothing is left" ran all 1000 in every case container. Here nothing is signalled:
    the forked helper's kill and uid change are stand-ins that count the passes into a pipe.
    """
    from gate_runner import invocations

    read_end, write_end = os.pipe()

    def count_pass(pid: int, sig: int) -> None:
        assert pid == -1, pid  # never a signal to anything here
        os.write(write_end, b".")

    class OsButKill:  # the module's own os only: no other code of this process sees it
        kill = staticmethod(count_pass)

        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

    monkeypatch.setattr(invocations, "drop_privileges", lambda uid: None)
    monkeypatch.setattr(invocations, "os", OsButKill())
    invocations._kill_all_of(10001)
    os.close(write_end)
    passes = b""
    while chunk := os.read(read_end, 4096):
        passes += chunk
    os.close(read_end)
    assert len(passes) == 3, f"the helper made {len(passes)} kill(-1) passes"

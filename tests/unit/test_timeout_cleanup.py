"""What still runs when an invocation outlasts its `timeout_s` (issue 39, items 2 and 3).

SDK `Middleware`: cleanup "runs last, once the run has ended, whether it completed, failed,
timed out or was cancelled"; seed 001: a builder's cleanup "runs after every agent invocation
-- pass, fail, or timeout", with `run["context"]` the run's run_context. At the deadline the
runner asks the invocation to end its run (a signal its main thread turns into the run's
end): the run fails with `timed out after N s`, its middleware cleanup (or its mock, and the
strict check) runs within a bounded grace, and a builder's cleanup then gets the run context
the invocation reported as it changed. A run that will not end is killed after the grace.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.fixtures.projects import write
from tests.fixtures.runner import judged

SLOW = {
    "agents/sleeper.yaml": """
        version: "1.0"
        name: sleeper
        description: Sleeps past its case's timeout_s.
        type: tool
        tool_name: slow.nap
    """,
    "tools/slow.py": """
        import time


        def nap(payload: dict, context: dict) -> str:
            context["napping"] = True
            time.sleep(float(payload.get("seconds", 30)))
            return "rested"
    """,
    "middleware/sleeper.py": """
        import json

        MARKER_DIR = "@MARKER_DIR@"


        def before(content, context):
            context["tenant"] = "acme"
            return content


        def cleanup(run, context):
            with open(MARKER_DIR + "/middleware", "w") as fh:
                json.dump({"run": run, "tenant": context.get("tenant")}, fh)
    """,
    "tests/builders/marked.py": """
        import json


        def build(context, builder_args, test_name, payload, files):
            context["marker_dir"] = builder_args["marker_dir"]
            return {"seconds": builder_args.get("seconds", 30)}


        def cleanup(run, context, builder_args):
            with open(context["marker_dir"] + "/builder", "w") as fh:
                json.dump({"context": run["context"], "output": run["output"]}, fh)
    """,
    "tests/mocks/quiet.py": """
        def middleware_before(content, context):
            context["tenant"] = "acme"
            return content
    """,
}


def project(tmp_path: Path, suite: str, files: dict[str, str] | None = None) -> Path:
    merged = {**SLOW, **(files or {}), "tests/sleeper.yaml": suite}
    merged["middleware/sleeper.py"] = merged["middleware/sleeper.py"].replace(
        "@MARKER_DIR@", str(tmp_path)
    )
    return write(tmp_path / "p", merged)


@pytest.mark.slow
def test_middleware_cleanup_runs_when_timeout_s_ends_the_run(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        """
        tests:
          - name: outlasts
            payload: '{"seconds": 30}'
            timeout_s: 1
            expected_result: status == "failed"
        """,
    )
    case = judged(root, "tests/sleeper.yaml", "outlasts")
    assert case.passed, case.failure_reason
    assert case.invocations[0].error == "timed out after 1 s (timeout_s)"
    seen = json.loads((tmp_path / "middleware").read_text())
    assert seen == {
        "run": {"status": "failed", "error": "timed out after 1 s (timeout_s)", "output": None},
        "tenant": "acme",
    }
    spans = [(s.type, s.name) for s in case.invocations[0].traces if s.type != "log"]
    assert ("middleware", "middleware.cleanup") in spans, spans


@pytest.mark.slow
def test_strict_middleware_mocks_fails_a_run_timeout_s_ended(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        """
        tests:
          - name: strict
            payload: '{"seconds": 30}'
            timeout_s: 1
            mocks: quiet
            strict_middleware_mocks: true
            expected_result: status == "failed"
        """,
    )
    case = judged(root, "tests/sleeper.yaml", "strict")
    assert not case.passed
    reason = case.invocations[0].failure_reason or ""
    assert "strict_middleware_mocks" in reason and "cleanup" in reason, reason


@pytest.mark.slow
def test_a_builders_late_cleanup_gets_the_run_context(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        f"""
        tests:
          - name: late
            builder: marked
            builder_args: {{seconds: 30, marker_dir: "{tmp_path}"}}
            timeout_s: 1
            mocks: quiet
            expected_result: status == "failed"
        """,
    )
    case = judged(root, "tests/sleeper.yaml", "late")
    assert case.passed, case.failure_reason
    seen = json.loads((tmp_path / "builder").read_text())
    context = seen["context"]
    assert seen["output"] is None
    assert context["agent_name"] == "sleeper" and context["connector_id"] is None
    assert context["run_id"] and context["timestamp"]
    assert context["tenant"] == "acme"  # what middleware added
    assert context["napping"] is True  # what the tool added
    assert context["payload"] == {"seconds": 30}


def test_a_builders_cleanup_after_a_crash_gets_the_run_context(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        f"""
        tests:
          - name: crash
            builder: marked
            builder_args: {{marker_dir: "{tmp_path}"}}
            mocks: quiet
            expected_result: status == "failed"
        """,
        {
            "tools/slow.py": """
                import os


                def nap(payload: dict, context: dict) -> str:
                    context["napping"] = True
                    os._exit(3)
            """
        },
    )
    case = judged(root, "tests/sleeper.yaml", "crash")
    assert case.passed, case.failure_reason
    context = json.loads((tmp_path / "builder").read_text())["context"]
    assert context["agent_name"] == "sleeper" and context["tenant"] == "acme"
    assert context["run_id"] and context["payload"] == {"seconds": 30}


@pytest.mark.slow
def test_a_run_that_will_not_end_is_still_killed(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        """
        tests:
          - name: stubborn
            payload: go
            timeout_s: 1
            expected_result: status == "failed"
        """,
        {
            "tools/slow.py": """
                import time


                def nap(payload: dict, context: dict) -> str:
                    while True:
                        try:
                            time.sleep(30)
                        except BaseException:
                            pass
            """
        },
    )
    started = time.monotonic()
    case = judged(root, "tests/sleeper.yaml", "stubborn")
    assert time.monotonic() - started < 30
    assert case.passed, case.failure_reason
    assert case.invocations[0].error == "timed out after 1 s (timeout_s)"

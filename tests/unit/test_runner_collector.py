"""A case container's runner runs with Python's cyclic collector off (gate_runner/__main__.py),
and its invocations, where user code runs, with it on."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gate_runner
from gate_service.runner_contract import parse_runner_output
from tests.fixtures.projects import write

PROJECT = {
    "agents/probe.yaml": """
        version: "1.0"
        name: probe
        description: Says whether its process collects cyclic garbage.
        type: tool
        tool_name: checks.probe
    """,
    "tools/checks.py": """
        import gc


        def probe(payload: dict, context: dict) -> dict:
            return {"collects": gc.isenabled()}
    """,
    "tests/probe.yaml": """
        agent: probe
        tests:
          - name: runs
            payload: '{}'
            expected_result: output.collects == true
    """,
}

# `python -m gate_runner run-case`, as a case container starts it, with the runner's own
# process saying at its end (main's os._exit) whether it collected.
RUNNER = """
import gc, os, sys

real_exit, runner = os._exit, os.getpid()


def exit_saying(code):
    if os.getpid() == runner:
        sys.stderr.write(f"runner collects: {{gc.isenabled()}}\\n")
        sys.stderr.flush()
    real_exit(code)


os._exit = exit_saying
sys.argv = ["gate_runner", "run-case", "--project", {project!r}, "--suite", "tests/probe.yaml",
            "--case", "runs"]
from gate_runner.__main__ import main

sys.exit(main())
"""


def test_the_runner_does_not_collect_and_its_invocations_do(tmp_path: Path) -> None:
    project = write(tmp_path / "p", PROJECT)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUNNER.format(project=str(project)))],
        capture_output=True,
        timeout=120,
        # The runner this test imports, whatever another checkout installed.
        env={**os.environ, "PYTHONPATH": str(Path(gate_runner.__file__).parent.parent)},
    )
    assert done.returncode == 0, done.stderr
    assert b"runner collects: False" in done.stderr
    result = parse_runner_output(done.stdout, suite="tests/probe.yaml", test_name="runs")
    assert result.passed, result.failure_reason
    assert result.invocations[0].output == {"collects": True}

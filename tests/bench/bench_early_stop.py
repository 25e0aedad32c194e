"""Benchmark: what early stop saves (run: python -m tests.bench.bench_early_stop).

The real runner in this process (forked invocations, as in a case container, without Docker:
the figure is the runner's own, the container's start-up is the same either way), on two
failing cases of `runs: 10`, each run with early stop and without, alternately, in one run:

- a tool agent whose every run takes 0.2 s and fails, at `success_threshold` 70 (7 of 10
  needed: the 4th failure decides it) and at the default 100 (the 1st does): the case's wall
  time with early stop as a ratio to the same case without it;
- a live LLM agent whose every run makes one model call, through the model gateway's wire
  (tests/fixtures/fake_gateway.py, answering at once) and fails its assertion, at 80% (the
  3rd failure decides it): the model calls made with early stop and without.

The verdicts are checked equal. Figures only: nothing else is asserted.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from gate_runner.case import run_case
from gate_runner.contract import CaseResult
from gate_runner.invocations import Isolation
from gate_runner.verdict import STOP_FAILING
from tests.fixtures.fake_gateway import FakeGateway
from tests.fixtures.projects import write

REPEATS = 3
RUN_SECONDS = 0.2

TOOL_PROJECT = {
    "agents/slow.yaml": """
        version: "1.0"
        name: slow
        description: Works for a while, then answers wrongly.
        type: tool
        tool_name: work.answer
    """,
    "tools/work.py": f"""
        import time


        def answer(payload: dict) -> dict:
            time.sleep({RUN_SECONDS})
            return {{"ok": False}}
    """,
    "tests/slow.yaml": """
        tests:
          - name: at_70
            payload: go
            runs: 10
            success_threshold: 70
            expected_result: output.ok == true
          - name: at_100
            payload: go
            runs: 10
            expected_result: output.ok == true
    """,
}
LIVE_PROJECT = {
    "agents/bot.yaml": """
        version: "1.0"
        name: bot
        description: Answers through a live model.
        model: openai/gpt-4o
        system_prompt: Be brief.
    """,
    "tests/bot.yaml": """
        tests:
          - name: says_goodbye
            payload: hi
            runs: 10
            success_threshold: 80
            expected_result: output == "goodbye"
    """,
}


def timed(project: Path, suite: str, case: str, mode: str | None) -> tuple[float, CaseResult]:
    started = time.monotonic()
    result = run_case(project, suite, case, Isolation(), stop_early=mode)
    return time.monotonic() - started, result


def tool_case(project: Path, case: str) -> None:
    times: dict[str | None, list[float]] = {STOP_FAILING: [], None: []}
    results: dict[str | None, CaseResult] = {}
    timed(project, "tests/slow.yaml", case, None)  # warm: the SDK and the runner imported
    for _ in range(REPEATS):
        for mode in (STOP_FAILING, None):
            seconds, results[mode] = timed(project, "tests/slow.yaml", case, mode)
            times[mode].append(seconds)
    stopped, full = results[STOP_FAILING], results[None]
    assert (stopped.passed, stopped.case_error) == (full.passed, full.case_error)
    on, off = statistics.median(times[STOP_FAILING]), statistics.median(times[None])
    print(
        f"  failing 10-run case at {full.success_threshold}%, {RUN_SECONDS} s a run: "
        f"{len(stopped.invocations)} of 10 invocations with early stop, median {on:.2f} s "
        f"({', '.join(f'{t:.2f}' for t in times[STOP_FAILING])}); without, median {off:.2f} s "
        f"({', '.join(f'{t:.2f}' for t in times[None])}); ratio {on / off:.2f}x, "
        f"{off - on:.2f} s saved; verdict {'passed' if full.passed else 'failed'} either way"
    )


def live_case(project: Path, socket: Path) -> None:
    gateway = FakeGateway(socket)
    gateway.start()
    try:
        calls: dict[str | None, int] = {}
        results: dict[str | None, CaseResult] = {}
        for mode in (STOP_FAILING, None):
            before = len(gateway.requests)
            results[mode] = run_case(
                project,
                "tests/bot.yaml",
                "says_goodbye",
                Isolation(gateway=gateway.channel),
                stop_early=mode,
            )
            calls[mode] = len(gateway.requests) - before
    finally:
        gateway.stop()
    stopped, full = results[STOP_FAILING], results[None]
    assert (stopped.passed, stopped.case_error) == (full.passed, full.case_error)
    print(
        f"  failing live 10-run case at 80%, one model call a run: {calls[STOP_FAILING]} model "
        f"calls with early stop, {calls[None]} without ({calls[None] - calls[STOP_FAILING]} "
        f"saved, {len(stopped.invocations)} of 10 invocations); verdict "
        f"{'passed' if full.passed else 'failed'} either way"
    )


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="gate-bench-early-"))
    try:
        tools = write(root / "tools", TOOL_PROJECT)
        print("early stop (--stop-early=failing) against every invocation, in one run:")
        tool_case(tools, "at_70")
        tool_case(tools, "at_100")
        live_case(write(root / "live", LIVE_PROJECT), root / "model.sock")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark: container start-to-result for one case (run: python -m tests.bench.bench_case_start).

Builds test images for two one-case bundles (a tool agent; a scripted LLM agent with a tool
and a child agent), runs each case's hardened container several times through the real
sandbox, and prints the median time from container start to parsed result, as a ratio to a
baseline measured in the same run: the same image starting `python -c pass`.
"""

from __future__ import annotations

import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import docker

from gate_runner import case_env
from gate_service.bundles.archive import read_archive
from gate_service.config import Settings
from gate_service.runner_contract import parse_runner_output
from gate_service.sandbox import INVOCATION_UID, RunLimits, TestImageSpec
from gate_service.sandbox.docker import DockerSandbox
from gate_service.worker.handler import runner_argv
from tests.fixtures.projects import AGENTS, LLM_PROJECT, bundle_of, write

REPEATS = 7
LIMITS = RunLimits(
    memory_mb=512,
    cpus=1.0,
    pids=256,
    wall_seconds=120,
    tmpfs_mb=64,
    output_limit_bytes=32 * 1024 * 1024,
)
TOOL_BUNDLE = {
    **{k: v for k, v in AGENTS.items() if k in ("agents/calc.yaml", "tools/math_ops.py")},
    "tests/calc.yaml": 'tests:\n  - name: adds\n    payload: \'{"a": 1, "b": 2}\'\n'
    "    expected_result: output.sum == 3\n",
}
LLM_BUNDLE = {
    **{k: v for k, v in LLM_PROJECT.items() if not k.startswith("tests/")},
    "tests/models/assistant.py": LLM_PROJECT["tests/models/assistant.py"],
    "tests/assistant.yaml": "tests:\n  - name: adds\n    payload: add please\n"
    "    expected_result: output.total == 15\n",
}


def build(sandbox: DockerSandbox, files: dict[str, str], tag: str, tmp: Path) -> str:
    ctx = tmp / tag.replace(":", "_")
    read_archive(bundle_of(write(tmp / f"src-{tag.replace(':', '_')}", files)), ctx / "bundle")
    return sandbox.build_test_image(TestImageSpec(tag=tag, context_dir=ctx))


def time_case(sandbox: DockerSandbox, image: str, suite: str, case: str) -> list[float]:
    times = []
    for _ in range(REPEATS):
        nonce = secrets.token_hex(32)
        started = time.monotonic()
        result = sandbox.run(
            image,
            runner_argv(sandbox.settings, suite, case),
            limits=LIMITS,
            labels={"gate.bench": "1"},
            stdin=case_env.encode({}, nonce),
        )
        assert parse_runner_output(result.stdout, nonce=nonce).passed
        times.append(time.monotonic() - started)
    return times


def time_baseline(client: docker.DockerClient, image: str) -> list[float]:
    times = []
    for _ in range(REPEATS):
        started = time.monotonic()
        client.containers.run(
            image,
            ["-c", "pass"],
            entrypoint=["python"],
            user=f"{INVOCATION_UID}:{INVOCATION_UID}",
            network_mode="none",
            remove=True,
        )
        times.append(time.monotonic() - started)
    return times


def main() -> None:
    settings = Settings(data_dir=Path(tempfile.mkdtemp(prefix="gate-bench-")))
    sandbox = DockerSandbox(settings)
    tmp = Path(tempfile.mkdtemp(prefix="gate-bench-ctx-"))
    try:
        tool_image = build(sandbox, TOOL_BUNDLE, "gate-bench:tool", tmp)
        llm_image = build(sandbox, LLM_BUNDLE, "gate-bench:llm", tmp)
        rows = [
            ("baseline: python -c pass", time_baseline(sandbox.client, tool_image)),
            ("tool agent, one case", time_case(sandbox, tool_image, "tests/calc.yaml", "adds")),
            (
                "scripted LLM agent + child, one case",
                time_case(sandbox, llm_image, "tests/assistant.yaml", "adds"),
            ),
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for tag in ("gate-bench:tool", "gate-bench:llm"):
            try:
                sandbox.client.images.remove(tag, force=True)
            except docker.errors.DockerException:
                pass
        sandbox.close()
    base = statistics.median(rows[0][1])
    print(f"{'container start to result':40} {'median s':>9} {'min s':>7} {'vs baseline':>12}")
    for label, times in rows:
        median = statistics.median(times)
        print(f"{label:40} {median:>9.3f} {min(times):>7.3f} {median / base:>11.2f}x")


if __name__ == "__main__":
    main()

"""What a case container's run reads back on the real engine: the runner's stdout always, its
stderr only when the runner broke (exited non-zero, or left no complete result block), which
is the only time anyone reads it (worker/outcome.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gate_service.config import Settings
from gate_service.runner_contract import result_blocks
from gate_service.sandbox import Sandbox, open_sandbox
from gate_service.worker.handler import case_limits
from tests.fixtures.docker import docker_engine

__all__ = ["docker_engine"]  # the fixture, used by name below
pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def sandbox(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    opened = open_sandbox(Settings(data_dir=tmp_path_factory.mktemp("case-output")))
    try:
        yield opened
    finally:
        opened.close()


def run(sandbox: Sandbox, *argv: str) -> tuple[int | None, bytes, bytes]:
    # The worker's limits for the sandbox's runtime: under gVisor, runc's pids would leave
    # gVisor's kernel short of threads, and it dies with exit 2, which this test reads.
    limits = case_limits(Settings(), wall_seconds=60, runtime=sandbox.runtime)
    result = sandbox.run(
        sandbox.runner_image(), list(argv), limits=limits, labels={"gate.gate_id": "none"}
    )
    return result.exit_code, result.stdout, result.stderr


def test_a_runner_that_broke_has_its_stderr_read(sandbox: Sandbox) -> None:
    code, stdout, stderr = run(sandbox, "run-case", "--suite=s", "--case=c", "--no-such-option")
    assert code == 2 and stdout == b""
    assert b"unrecognized arguments: --no-such-option" in stderr


def test_a_runner_that_judged_its_case_has_no_stderr_read(sandbox: Sandbox) -> None:
    # No project at that path: the runner still judges (a case error) and exits 0.
    code, stdout, stderr = run(sandbox, "run-case", "--project=/nowhere", "--suite=s", "--case=c")
    assert code == 0 and result_blocks(stdout) == 1
    assert b"/nowhere" in stdout and stderr == b""

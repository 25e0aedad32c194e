"""Infrastructure failures reach a gate's failure_reason as a short summary and a reference,
never with the host's paths, SQL or Docker socket; the worker log has the full detail under
that reference (issue 9, item 5). Real Postgres, the in-process fake sandbox."""

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate_service.config import Settings
from gate_service.models import Job
from gate_service.sandbox import ModelChannel, RunLimits, RunResult
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.sandbox import FakeSandbox, fake_worker

REFERENCE = re.compile(r"\(reference ([0-9a-f]{12}); the full detail is in the worker log\)")


class CrashingRunner(FakeSandbox):
    """The container runs, but the runner dies printing host details to stderr."""

    def __init__(self, stderr: bytes) -> None:
        super().__init__()
        self.stderr = stderr

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Mapping[str, str],
        stdin: bytes = b"",
        halt: threading.Event | None = None,
        model_channel: ModelChannel | None = None,
    ) -> RunResult:
        self.runs.append(list(argv))
        return RunResult(
            exit_code=70,
            stdout=b"",
            stderr=self.stderr,
            duration_ms=1,
            timed_out=False,
            oom_killed=False,
            output_truncated=False,
        )


def submit(client: TestClient, tmp_path: Path) -> str:
    data = bundle_of(calculator_project(tmp_path / "p", failing=False))
    response = client.post(
        "/v1/gates", files={"bundle": ("b.tgz", data)}, data={"filter": "adds_two"}
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_an_engine_failure_is_stored_without_host_details(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data_dir = str(settings.data_dir)
    sandbox = FakeSandbox()
    sandbox.fail_runs_with = (
        "running the case container failed: 500 Server Error for "
        "http+docker://localhost/v1.43/containers/create: Internal Server Error "
        f'("error mounting {data_dir}/gate-1a2b/bundle: permission denied") '
        "via unix:///var/run/docker.sock"
    )
    gate_id = submit(client, tmp_path)
    worker = fake_worker(settings, sessions, sandbox)
    with caplog.at_level(logging.ERROR, logger="gate_service.worker.handler"):
        worker.run_once()
        with sessions() as s:
            first = s.scalars(select(Job.last_error)).one() or ""
        worker.run_once()  # job_max_attempts == 2: this attempt gives up
    gate = client.get(f"/v1/gates/{gate_id}").json()
    reason = gate["failure_reason"]
    assert gate["status"] == "error"
    assert reason.startswith(
        "infrastructure error after 2 attempt(s): running the case container failed: "
        "500 Server Error for <url>"
    ), reason
    for text in (reason, gate["error"], first):
        for leak in (data_dir, "docker.sock", "http+docker", "/var/run", "gate-1a2b"):
            assert leak not in text, (leak, text)
    # Each attempt has its reference; the log has the full message under it.
    found = REFERENCE.search(reason)
    assert found and REFERENCE.search(first)
    logged = [r for r in caplog.records if found.group(1) in r.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert data_dir in caplog.text and "unix:///var/run/docker.sock" in caplog.text


def test_a_runner_crash_keeps_its_stderr_in_the_log_not_the_reason(
    client: TestClient,
    settings: Settings,
    sessions: sessionmaker[Session],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stderr = (
        "Traceback (most recent call last):\n"
        f'  File "{settings.data_dir}/gate-9f/runner.py", line 3\n'
        "psycopg.OperationalError: SELECT secret FROM projects\n"
    ).encode()
    gate_id = submit(client, tmp_path)
    with caplog.at_level(logging.ERROR, logger="gate_service.worker.handler"):
        fake_worker(settings, sessions, CrashingRunner(stderr)).run_once()
    gate = client.get(f"/v1/gates/{gate_id}").json()
    (case,) = gate["cases"]
    assert case["status"] == "error"
    reason = case["failure_reason"]
    assert reason.startswith("the runner failed (exit code 70): the runner printed no result"), (
        reason
    )
    for leak in (str(settings.data_dir), "Traceback", "SELECT", "psycopg", "stderr"):
        assert leak not in reason, (leak, reason)
    found = REFERENCE.search(reason)
    assert found
    logged = [r.getMessage() for r in caplog.records if found.group(1) in r.getMessage()]
    assert logged and "SELECT secret FROM projects" in logged[0]

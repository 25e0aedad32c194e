"""A PostgreSQL restart mid-gate ends with a verdict, never a lost or half-written gate
(issue #12 item 5).

The server here is a private one (pg_ctl on a data directory of the test's own), so the test
can really stop and start it without touching the server other tests share. The worker is
the real one over the fake sandbox; the fake's `run` is where the restart happens, so it
falls between two cases every time, with no timing involved.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gate_service import migrate
from gate_service.config import Settings
from gate_service.db import make_engine, make_sessionmaker
from gate_service.main import create_app
from gate_service.sandbox import RunLimits, RunResult
from tests.e2e.conftest import free_port
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.sandbox import FakeSandbox, fake_worker

PG_CTL = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
TERMINAL = {"passed", "failed", "error", "cancelled"}


class PrivatePostgres:
    def __init__(self, root: Path) -> None:
        self.bin = PG_CTL[-1].parent
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        shutil.chown(root, "postgres", "postgres")
        self._as_postgres(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust"
        )

    def _as_postgres(self, *argv: str) -> None:
        proc = subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            # What pg_ctl and the server said: a failed start is otherwise a bare exit 1.
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            raise AssertionError(
                f"{' '.join(argv)} exited {proc.returncode}: {proc.stdout}{proc.stderr}\n"
                f"server.log:\n{tail}"
            )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        # A generous bound for a start on a loaded machine: only a hang should reach it.
        self._as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "240",
            "-l", str(self.root / "server.log"), "-o", options, "start",
        )  # fmt: skip

    def stop(self) -> None:
        self._as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-m", "fast", "stop"
        )


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    if not PG_CTL or shutil.which("runuser") is None:
        pytest.skip("needs Debian's postgresql binaries and runuser (CI installs them)")
    # Not under pytest's tmp root: it is 0700 root, and the server runs as user postgres.
    root = Path(tempfile.mkdtemp(prefix="gate-pg-restart-", dir="/var/tmp"))
    server = PrivatePostgres(root)
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop()
        except AssertionError:
            pass  # already stopped by the test
        shutil.rmtree(root, ignore_errors=True)


class RestartingSandbox(FakeSandbox):
    """Runs cases like FakeSandbox; before returning the result of its case number ``at``
    (1-based), it calls ``fault`` (a restart, or a stop that the test undoes later)."""

    def __init__(self, at: int, fault: object) -> None:
        super().__init__()
        self.at = at
        self.fault = fault
        self.calls = 0

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Mapping[str, str],
        stdin: bytes = b"",
        **kwargs: object,
    ) -> RunResult:
        result = super().run(image, argv, limits=limits, labels=labels, stdin=stdin, **kwargs)  # type: ignore[arg-type]
        self.calls += 1
        if self.calls == self.at:
            self.fault()  # type: ignore[operator]
        return result


# Its own PostgreSQL server, started and restarted with pg_ctl.
pytestmark = pytest.mark.postgres


def judge_until_terminal(
    client: TestClient, worker_run_once: object, gate_id: str, seconds: float = 180
) -> dict[str, object]:
    """Run the worker until the gate has a verdict, as a worker's loop would (it survives its
    own errors and backs off); the bound is generous, only a hang hits it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            worker_run_once()  # type: ignore[operator]
        except Exception:
            time.sleep(0.5)  # Worker.run logs and backs off the same way
        gate: dict[str, object] = client.get(f"/v1/gates/{gate_id}").json()
        if gate.get("status") in TERMINAL:
            return gate
        time.sleep(0.2)
    raise AssertionError(f"gate {gate_id} had no verdict after {seconds} s")


def settings_for(url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=url,
        data_dir=tmp_path / "data",
        bootstrap_token=ADMIN_TOKEN,
        trusted_hosts="testserver",
        job_lease_seconds=5,  # a job whose worker failed mid-write is requeued soon
        # A 5 s lease can also lapse on a loaded machine (its renewal every 1.7 s comes late),
        # and each lapse costs an attempt: with 3, two such lapses besides the outage ended
        # the gate error under a full parallel run. The outage costs one; the rest is room.
        job_max_attempts=10,
    )


@pytest.mark.parametrize("outage", ["restart", "down during a write"])
def test_a_postgres_restart_mid_gate_ends_with_a_verdict(
    private_postgres: PrivatePostgres, tmp_path: Path, outage: str
) -> None:
    migrate.upgrade(private_postgres.url)
    settings = settings_for(private_postgres.url, tmp_path)
    if outage == "restart":
        # Stopped and started between two cases: every pooled connection is dead after it.
        def fault() -> None:
            private_postgres.stop()
            private_postgres.start()
    else:
        # Stopped before the worker writes the case's result: that write fails, the job is
        # left to its lease; the test starts the server again before judging on.
        fault = private_postgres.stop

    sandbox = RestartingSandbox(at=2, fault=fault)
    engine = make_engine(private_postgres.url)
    try:
        worker = fake_worker(settings, make_sessionmaker(engine), sandbox)
        with TestClient(create_app(settings), headers=bearer(ADMIN_TOKEN)) as client:
            project = calculator_project(tmp_path / "p", failing=False)
            response = client.post("/v1/gates", files={"bundle": ("b.tgz", bundle_of(project))})
            assert response.status_code == 202, response.text
            gate_id = response.json()["id"]
            try:
                worker.run_once()
            except Exception:
                pass  # a worker's loop logs this and goes on
            if outage != "restart":
                private_postgres.start()
            gate = judge_until_terminal(client, worker.run_once, gate_id)
    finally:
        engine.dispose()
    # The passing project's verdict, with every case judged exactly once in the end.
    assert gate["status"] == "passed", gate
    cases = gate["cases"]
    assert isinstance(cases, list) and len(cases) == 4
    assert all(case["passed"] for case in cases)
    assert sandbox.calls >= 4

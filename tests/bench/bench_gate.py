"""Benchmark: a warm 20-case gate, POST to verdict (run: python -m tests.bench.bench_gate).

Starts `gate serve` (on GATE_TEST_DATABASE_URL, else its embedded Postgres) with its default
settings, submits a 20-case tool-agent bundle once to build and cache its test image, then
times further submissions of the same bundle from POST to the verdict read by long-polling,
as a pipeline sees them. Between them it times 20 sequential bare runs of that same test
image (`docker run --rm --network none --entrypoint python3 IMAGE -c pass`; the image's own
entrypoint is the runner) and prints the ratio of the medians against the 0.6x target.

Two floors, measured in the same run, say how much of the gate's time any one-container-per-
case design must spend here: the same 20 bare runs started N at a time (N being the gate's
case concurrency), and 20 containers created as the gate creates its case containers that do
nothing but the one import every case needs (`python -I -c "import connic"`, the format's
SDK and pydantic), also N at a time.

GATE_CASE_CONCURRENCY, if set, is passed on, to compare other values with the default. It
prints figures and asserts nothing about timing: they depend on the machine (its CPU
count is the default GATE_CASE_CONCURRENCY) and on what else runs on it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import docker

from gate_service.client.api import GateClient
from gate_service.config import Settings
from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.ports import free_port
from tests.fixtures.projects import bundle_of, tool_cases_project

CASES = 20
REPEATS = 3
TARGET = 0.6
BARE_RUN = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3"]
RUNNER_PYTHON = "/opt/gate-runner/bin/python"  # the runner's interpreter, with the SDK
FORMAT = "{{.Repository}}:{{.Tag}}"


def serve(data_dir: Path, database: str | None) -> tuple[subprocess.Popen[bytes], str, Path]:
    """`gate serve` on its defaults (its embedded Postgres unless ``database`` is given)."""
    port = free_port()
    settings = {"GATE_PORT": str(port)}
    if database:
        settings["GATE_DATABASE_URL"] = database
    if "GATE_CASE_CONCURRENCY" in os.environ:  # to compare with the default
        settings["GATE_CASE_CONCURRENCY"] = os.environ["GATE_CASE_CONCURRENCY"]
    proc, log_path = start("serve", data_dir, **settings)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log_path)  # a first start may bootstrap the base image
    except BaseException:
        stop(proc)
        raise
    return proc, url, log_path


def judge(client: GateClient, bundle: bytes) -> tuple[float, dict[str, Any]]:
    """Seconds from POST to the verdict, and the finished gate."""
    started = time.monotonic()
    gate = client.submit(bundle)
    done = client.wait(gate["id"], timeout_s=600)
    elapsed = time.monotonic() - started
    if done["status"] != "passed" or done["total_cases"] != CASES:
        raise RuntimeError(f"the gate did not pass all {CASES} cases: {done}")
    return elapsed, done


def bare_runs(image: str, *, at_once: int = 1) -> float:
    """Seconds for CASES bare `docker run` of ``image``, ``at_once`` at a time."""

    def one(_: int) -> None:
        subprocess.run([*BARE_RUN, image, "-c", "pass"], check=True, stdout=subprocess.DEVNULL)

    started = time.monotonic()
    with ThreadPoolExecutor(at_once) as pool:
        list(pool.map(one, range(CASES)))
    return time.monotonic() - started


def import_only_runs(client: docker.DockerClient, image: str, *, at_once: int) -> float:
    """Seconds for CASES containers that only import the SDK, ``at_once`` at a time, created
    as the gate creates its case containers (through the API, no network, NetworkDisabled)."""

    def one(_: int) -> None:
        container = client.containers.create(
            image,
            ["-I", "-c", "import connic"],
            entrypoint=RUNNER_PYTHON,
            network_mode="none",
            network_disabled=True,
        )
        try:
            container.start()
            if container.wait()["StatusCode"] != 0:
                raise RuntimeError(f"`import connic` failed: {container.logs()[-2000:]!r}")
        finally:
            container.remove(force=True)

    started = time.monotonic()
    with ThreadPoolExecutor(at_once) as pool:
        list(pool.map(one, range(CASES)))
    return time.monotonic() - started


def test_image_of(sha256: str) -> str:
    out = subprocess.run(
        ["docker", "images", "--filter", f"label=gate.bundle={sha256}", "--format", FORMAT],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not out:
        raise RuntimeError(f"no test image labelled gate.bundle={sha256}")
    return out[0]


def seconds_between(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def main() -> None:
    server_url = os.environ.get("GATE_TEST_DATABASE_URL")
    database = create_database(server_url) if server_url else None
    data_dir = Path(tempfile.mkdtemp(prefix="gate-bench-gate-"))
    src = Path(tempfile.mkdtemp(prefix="gate-bench-src-"))
    bundle = bundle_of(tool_cases_project(src, CASES))
    proc, url, log_path = serve(data_dir, database)
    client = GateClient(url, token=ADMIN_TOKEN)
    engine = docker.from_env()
    gates: list[float] = []
    bare: list[float] = []
    parallel: list[float] = []
    importing: list[float] = []
    at_once = int(os.environ.get("GATE_CASE_CONCURRENCY") or Settings().case_concurrency)
    last: dict[str, Any] = {}
    try:
        cold, first = judge(client, bundle)  # builds and caches the test image
        image = test_image_of(first["bundle"]["sha256"])
        for _ in range(REPEATS):
            elapsed, last = judge(client, bundle)
            gates.append(elapsed)
            bare.append(bare_runs(image))
            parallel.append(bare_runs(image, at_once=at_once))
            importing.append(import_only_runs(engine, image, at_once=at_once))
    except Exception:
        print(f"gate serve's log, last lines:\n{log_path.read_text()[-4000:]}", file=sys.stderr)
        raise
    finally:
        client.close()
        engine.close()
        stop(proc)
        if server_url and database:
            drop_database(server_url, database)
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)
    gate_s, bare_s = statistics.median(gates), statistics.median(bare)
    durations = [c["duration_ms"] / 1000 for c in last["cases"] if c.get("duration_ms")]
    print(
        f"{CASES}-case tool-agent gate, `gate serve` defaults "
        f"(GATE_CASE_CONCURRENCY={Settings().case_concurrency}, {os.cpu_count()} CPUs)"
    )
    print(f"  first submission (builds the test image): {cold:.2f} s")
    print(
        f"  warm, POST to verdict: median {gate_s:.2f} s  ({', '.join(f'{g:.2f}' for g in gates)})"
    )
    print(
        f"  {CASES} sequential bare `docker run --rm --network none` of its image: median "
        f"{bare_s:.2f} s  ({', '.join(f'{b:.2f}' for b in bare)})"
    )
    ratio = gate_s / bare_s
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"  ratio {ratio:.2f}x (target <= {TARGET}x: {verdict})")
    for label, figures in (
        (f"the same bare runs, {at_once} at a time", parallel),
        (
            f"{CASES} containers as the gate makes them that only `import connic`, "
            f"{at_once} at a time",
            importing,
        ),
    ):
        floor = statistics.median(figures)
        print(
            f"  floor: {label}: median {floor:.2f} s ({floor / bare_s:.2f}x the bare runs; "
            f"the gate is {gate_s / floor:.2f}x this)"
        )
    print(
        f"  last warm gate: created to started {seconds_between(last['created_at'], last['started_at']):.2f} s, "
        f"started to finished {seconds_between(last['started_at'], last['finished_at']):.2f} s; "
        f"runner-reported case time: median {statistics.median(durations):.2f} s, "
        f"sum {sum(durations):.2f} s"
    )


if __name__ == "__main__":
    main()

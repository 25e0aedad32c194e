"""Benchmark: status reads (run: python -m tests.bench.bench_status).

Starts `gate api` in a subprocess (on GATE_TEST_DATABASE_URL, else an embedded Postgres),
creates a gate with 20 judged cases (a ~7 KB body), then:

1. with `wrk` (apt-get install wrk), 50 connections each: the rate of `/healthz` and of
   `GET /v1/gates/{id}`, and their ratio against the 0.5x target;
2. 500 idle long-polls (`?wait=20` with the current ETag) held for their 20 s: the API
   process's CPU (from /proc/<pid>/stat) against 10 %, and the p99 of `/healthz` probes sent
   meanwhile against 50 ms; then one change to the gate, and how many waiters it answered.

Loopback only and bounded in time. It prints figures and asserts nothing about timing: the
numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy import text

from gate_service.db import make_engine, make_sessionmaker, session_scope
from gate_service.models import Case, CaseStatus, Gate, Run
from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.ports import free_port

CONNECTIONS = 50
WRK_SECONDS = 10
LONG_POLLS = 500
LONG_POLL_WAIT = 20
CPU_WINDOW_SECONDS = 12
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def bundle() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("agents/a.yaml", b"name: a\n"), ("tests/t.yaml", b"tests: []\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def judged_cases(database: str, gate_id: uuid.UUID, cases: int = 20, runs: int = 3) -> None:
    """Cases and runs as a worker would leave them, so the body has a realistic size."""
    engine = make_engine(database, pool_size=1)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            gate = session.get_one(Gate, gate_id)
            for position in range(cases):
                case = Case(
                    gate_id=gate_id,
                    position=position,
                    suite=f"tests/suite_{position // 5}.yaml",
                    agent_name="calculator",
                    test_name=f"adds numbers correctly, variant {position}",
                    status=CaseStatus.passed,
                    passed=True,
                    successes=runs,
                    runs=runs,
                    success_threshold=runs,
                    timeout_s=60,
                    duration_ms=1234,
                    failure_reason=None,
                )
                session.add(case)
                session.flush()
                for index in range(runs):
                    session.add(Run(case_id=case.id, index=index, status="completed", passed=True))
            gate.revision += 1
    finally:
        engine.dispose()


def bump(database: str, gate_id: uuid.UUID) -> None:
    engine = make_engine(database, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE gates SET revision = revision + 1 WHERE id = :id"), {"id": gate_id}
            )
    finally:
        engine.dispose()


def wrk(url: str) -> tuple[float, str]:
    """Requests per second at CONNECTIONS connections, and wrk's latency line."""
    out = subprocess.run(
        [
            "wrk",
            f"-c{CONNECTIONS}",
            "-t2",
            f"-d{WRK_SECONDS}s",
            "--latency",
            "-H",
            f"Authorization: Bearer {ADMIN_TOKEN}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=WRK_SECONDS + 60,
        check=True,
    ).stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        print(f"  wrk saw {non2xx.group(1)} non-2xx/3xx answers from {url}")
    latency = re.search(r"^\s+Latency\s+(.*)$", out, re.MULTILINE)
    return (float(rate.group(1)) if rate else 0.0), (latency.group(1) if latency else "")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def probe_healthz(url: str, stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            started = time.perf_counter()
            client.get(f"{url}/healthz")
            latencies.append(time.perf_counter() - started)
            stop.wait(0.05)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def long_polls(
    url: str, gate: str, etag: str, pid: int, database: str, gate_id: uuid.UUID
) -> None:
    limits = httpx.Limits(max_connections=LONG_POLLS + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        headers={**HEADERS, "If-None-Match": etag}, limits=limits, timeout=LONG_POLL_WAIT + 30
    ) as client:
        started = time.monotonic()
        polls = [
            asyncio.create_task(client.get(f"{url}/v1/gates/{gate}?wait={LONG_POLL_WAIT}"))
            for _ in range(LONG_POLLS)
        ]
        await asyncio.sleep(4)  # every poll has connected and read its gate once
        latencies: list[float] = []
        stop = threading.Event()
        prober = threading.Thread(target=probe_healthz, args=(url, stop, latencies))
        before, at = cpu_seconds(pid), time.monotonic()
        prober.start()
        await asyncio.sleep(CPU_WINDOW_SECONDS)
        stop.set()
        await asyncio.to_thread(prober.join)
        cpu = (cpu_seconds(pid) - before) / (time.monotonic() - at)
        pending = sum(1 for p in polls if not p.done())
        print(
            f"{LONG_POLLS} idle long-polls ({pending} still waiting): API CPU {cpu:.1%} "
            f"(target <= 10%) over {CPU_WINDOW_SECONDS} s"
        )
        print(
            f"/healthz during them: p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
            f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms (target <= 50 ms), "
            f"{len(latencies)} probes"
        )
        # One change before the waits end: every waiter should answer it with 200.
        changed = time.monotonic()
        if time.monotonic() - started < LONG_POLL_WAIT - 1:
            await asyncio.to_thread(bump, database, gate_id)
        answers = await asyncio.gather(*polls, return_exceptions=True)
        codes: dict[str, int] = {}
        for answer in answers:
            key = str(answer.status_code) if isinstance(answer, httpx.Response) else "error"
            codes[key] = codes.get(key, 0) + 1
        print(
            f"after one change to the gate: answers {codes}, all in "
            f"{time.monotonic() - changed:.2f} s"
        )


def main() -> None:
    if shutil.which("wrk") is None:
        sys.exit("this benchmark needs wrk: apt-get install wrk")
    server_url = os.environ.get("GATE_TEST_DATABASE_URL")
    embedded = None
    data_dir = Path(tempfile.mkdtemp())
    if not server_url:
        from gate_service.pg import EmbeddedPostgres

        embedded = EmbeddedPostgres(data_dir / "pg")
        server_url = embedded.url
    database = create_database(server_url)
    port = free_port()
    (data_dir / "data").mkdir()
    proc, log_path = start(
        "api", data_dir / "data", GATE_DATABASE_URL=database, GATE_PORT=str(port)
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log_path)
        created = httpx.post(
            f"{url}/v1/gates", files={"bundle": ("b.tgz", bundle())}, headers=HEADERS, timeout=60
        )
        created.raise_for_status()
        gate = created.json()["id"]
        judged_cases(database, uuid.UUID(gate))
        first = httpx.get(f"{url}/v1/gates/{gate}", headers=HEADERS, timeout=10)
        first.raise_for_status()
        print(f"gate {gate}: body {len(first.content)} bytes, ETag {first.headers['etag']}")

        health, health_latency = wrk(f"{url}/healthz")
        status, status_latency = wrk(f"{url}/v1/gates/{gate}")
        print(
            f"/healthz          {health:8.0f} req/s at {CONNECTIONS} connections  ({health_latency})"
        )
        print(
            f"GET /v1/gates/id  {status:8.0f} req/s at {CONNECTIONS} connections  ({status_latency})"
        )
        print(f"ratio {status / health:.2f} (target >= 0.5)")

        asyncio.run(
            long_polls(url, gate, first.headers["etag"], proc.pid, database, uuid.UUID(gate))
        )
    finally:
        stop(proc)
        drop_database(server_url, database)
        if embedded is not None:
            embedded.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

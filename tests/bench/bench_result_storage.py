"""Benchmark: /healthz while a worker redacts and stores a worst-case result
(run: python -m tests.bench.bench_result_storage).

Starts `gate serve` (its worker in a process of its own) on GATE_TEST_DATABASE_URL, else an
embedded Postgres, with the real Docker engine. Project `default` gets the most secrets a
project may hold (100), each about 1 KB and each a near miss of the result's text; then a
gate whose one case returns 500 strings of 16,000 characters (8 MB: every string is a near
miss of every secret, which made the old redaction's one regular expression take minutes,
and as large as the runner keeps a string). `/healthz` is probed back to back, first on the
idle service (the baseline, measured in the same run), then from the submission to the
verdict. Prints both p50 and p99 and their ratio; the target is a p99 under 50 ms while the
result is stored. It asserts nothing: the figures depend on the machine and its load.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.ports import free_port
from tests.fixtures.projects import bundle_of, write

SECRETS = 100
STRINGS = 500
STRING_CHARS = 16_000
IDLE_SECONDS = 5
TARGET_P99_MS = 50.0

PROJECT = {
    "agents/big.yaml": """
        version: "1.0"
        name: big
        description: Returns the largest result the runner keeps, a near miss of every secret.
        type: tool
        tool_name: big.result
    """,
    "tools/big.py": f"""
        def result(payload: dict) -> dict:
            # "a" * 1020 is where every secret starts; none of them ends with "aaaa".
            return {{"strings": ["a" * {STRING_CHARS}] * {STRINGS}}}
    """,
    "tests/big.yaml": """
        agent: big
        tests:
          - name: stores_a_worst_case_result
            payload: '{}'
            expected_result: status == "completed"
    """,
}


def probe(url: str, until: threading.Event, into: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while not until.is_set():
            started = time.perf_counter()
            client.get("/healthz").raise_for_status()
            into.append((time.perf_counter() - started) * 1000)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> int:
    server_url = os.environ.get("GATE_TEST_DATABASE_URL")
    if not server_url:
        print("set GATE_TEST_DATABASE_URL to a PostgreSQL server (as .ci/run does)")
        return 2
    database = create_database(server_url)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        proc, log_path = start("serve", data_dir, GATE_DATABASE_URL=database, GATE_PORT=str(port))
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, log_path)
            http = httpx.Client(base_url=url, headers=bearer(ADMIN_TOKEN), timeout=60)
            for i in range(SECRETS):
                value = "a" * 1020 + f"{i:04d}"
                http.put(
                    f"/v1/projects/default/secrets/K_{i:03d}", json={"value": value}
                ).raise_for_status()

            idle: list[float] = []
            stop_idle = threading.Event()
            prober = threading.Thread(target=probe, args=(url, stop_idle, idle))
            prober.start()
            time.sleep(IDLE_SECONDS)
            stop_idle.set()
            prober.join()

            during: list[float] = []
            done = threading.Event()
            prober = threading.Thread(target=probe, args=(url, done, during))
            started = time.monotonic()
            gate = http.post(
                "/v1/gates",
                files={"bundle": ("b.tgz", bundle_of(write(data_dir / "project", PROJECT)))},
            ).json()
            prober.start()
            while True:
                gate = http.get(f"/v1/gates/{gate['id']}", params={"wait": 30}).json()
                if gate["status"] not in ("queued", "running"):
                    break
            done.set()
            prober.join()
            took = time.monotonic() - started
            http.close()
        finally:
            stop(proc)
            drop_database(server_url, database)
    print(f"gate {gate['status']} in {took:.1f} s ({gate.get('failure_reason') or 'no reason'})")
    for name, values in (("idle", idle), ("while storing", during)):
        print(
            f"/healthz {name}: {len(values)} probes, p50 {percentile(values, 50):.1f} ms, "
            f"p99 {percentile(values, 99):.1f} ms, max {max(values):.1f} ms"
        )
    ratio = percentile(during, 99) / percentile(idle, 99)
    verdict = "met" if percentile(during, 99) < TARGET_P99_MS else "NOT met"
    print(
        f"p99 while storing / idle p99: {ratio:.2f}x; target p99 < {TARGET_P99_MS:.0f} ms: "
        f"{verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

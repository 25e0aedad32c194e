"""Benchmark: a gate of 20 live cases that wait on their model (run:
python -m tests.bench.bench_live_cases).

Starts `gate serve` (on GATE_TEST_DATABASE_URL, else its embedded Postgres) with its default
settings and the OpenAI-compatible fake provider on this host, which answers every call after
1 s. Each case's agent makes 2 calls (a tool call, then its answer), through its worker's
model gateway. After one submission that builds the test image, it times, POST to verdict,
a gate of the one case alone and a gate of all 20, and prints their ratio against the 3x
target: a case waiting on its model lends its case slot, so the worker overlaps live cases
beyond its core count (bounded by GATE_MAX_CASE_CONTAINERS), where running them
GATE_CASE_CONCURRENCY at a time would take about 20 / that times one case.

It also prints the CPU-seconds an invocation paid for its model client before the gateway
(a fresh process importing LiteLLM, as each live invocation did) and now (the runner's
gateway client, the standard library), each measured here in a fresh interpreter. Figures
only: nothing is asserted; they depend on the machine and what else runs on it.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from gate_service.client.api import GateClient
from gate_service.config import Settings
from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN, bearer, project_token
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.ports import free_port
from tests.fixtures.projects import bundle_of, write

CASES = 20
REPEATS = 3
LATENCY_S = 1.0
TARGET = 3.0
ANSWER = "hello from the fake provider"


def live_project(root: Path, cases: int) -> bytes:
    files = {
        "agents/looker.yaml": """
            version: "1.0"
            name: looker
            description: Looks something up, then answers.
            model: openai/gpt-4o
            system_prompt: Look it up, then answer.
            tools: [helpers.lookup]
        """,
        "tools/helpers.py": """
            def lookup(q: str) -> dict:
                return {"found": q}
        """,
        "tests/looker.yaml": "tests:\n"
        + "".join(
            f"  - name: looks_up_{i}\n    payload: question {i}\n"
            f"    expected_result: output == {ANSWER!r}\n"
            for i in range(cases)
        ),
    }
    return bundle_of(write(root, files))


def tool_then_answer(body: dict[str, Any]) -> str:
    """A tool call first; the answer once the conversation holds the tool's result."""
    return "ok" if any(m.get("role") == "tool" for m in body.get("messages", [])) else "tool"


def judge(client: GateClient, bundle: bytes, cases: int) -> float:
    started = time.monotonic()
    gate = client.submit(bundle)
    done = client.wait(gate["id"], timeout_s=900)
    elapsed = time.monotonic() - started
    if done["status"] != "passed" or done["total_cases"] != cases:
        reasons = [
            c.get("failure_reason") for c in done.get("cases", []) if c.get("failure_reason")
        ][:3]
        raise RuntimeError(f"the gate did not pass all {cases} cases: {done['status']} {reasons}")
    return elapsed


def import_cpu_seconds(statement: str) -> float:
    """User+system CPU of a fresh interpreter that runs ``statement`` (the runner's path)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    subprocess.run([sys.executable, "-c", statement], check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    server_url = os.environ.get("GATE_TEST_DATABASE_URL")
    database = create_database(server_url) if server_url else None
    data_dir = Path(tempfile.mkdtemp(prefix="gate-bench-live-"))
    src = Path(tempfile.mkdtemp(prefix="gate-bench-live-src-"))
    provider = FakeProvider()
    provider.decide = tool_then_answer
    provider.delay_s = LATENCY_S
    port = free_port()
    settings = {"GATE_PORT": str(port)}
    if database:
        settings["GATE_DATABASE_URL"] = database
    proc, log_path = start("serve", data_dir, **settings)
    url = f"http://127.0.0.1:{port}"
    ones: list[float] = []
    gates: list[float] = []
    try:
        wait_ready(url, proc, log_path)
        with httpx.Client(base_url=url, headers=bearer(ADMIN_TOKEN), timeout=60) as admin:
            token = project_token(admin, "bench", ["submit", "read"])
            for name, value in {
                "OPENAI_API_KEY": "sk-bench",
                "OPENAI_API_BASE": provider.url,
            }.items():
                admin.put(f"/v1/projects/bench/secrets/{name}", json={"value": value})
        client = GateClient(url, token=token)
        one, many = live_project(src / "one", 1), live_project(src / "many", CASES)
        try:
            judge(client, one, 1)  # builds the test image of the one-case bundle
            judge(client, many, CASES)  # and of the 20-case bundle
            for _ in range(REPEATS):
                ones.append(judge(client, one, 1))
                gates.append(judge(client, many, CASES))
        finally:
            client.close()
    except Exception:
        print(f"gate serve's log, last lines:\n{log_path.read_text()[-4000:]}", file=sys.stderr)
        raise
    finally:
        stop(proc)
        provider.close()
        if server_url and database:
            drop_database(server_url, database)
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)
    defaults = Settings()
    one_s, gate_s = statistics.median(ones), statistics.median(gates)
    print(
        f"{CASES} live cases x 2 model calls, each answered after {LATENCY_S:.0f} s; `gate serve` "
        f"defaults (GATE_CASE_CONCURRENCY={defaults.case_concurrency}, container slots "
        f"{defaults.case_container_limit()}, {os.cpu_count()} CPUs)"
    )
    print(
        f"  one case alone, POST to verdict: median {one_s:.2f} s ({', '.join(f'{o:.2f}' for o in ones)})"
    )
    print(
        f"  all {CASES}, POST to verdict: median {gate_s:.2f} s ({', '.join(f'{g:.2f}' for g in gates)})"
    )
    ratio = gate_s / one_s
    print(
        f"  ratio {ratio:.2f}x (target <= {TARGET:.0f}x: {'met' if ratio <= TARGET else 'NOT met'}; "
        f"{defaults.case_concurrency} at a time would be about {CASES / defaults.case_concurrency:.0f}x)"
    )
    before = import_cpu_seconds("import litellm")
    after = import_cpu_seconds("import gate_runner.models")
    print(
        f"  CPU-seconds per live invocation for its model client: before (LiteLLM imported in "
        f"the invocation) {before:.2f} s, now (the gateway client) {after:.2f} s"
    )


if __name__ == "__main__":
    main()

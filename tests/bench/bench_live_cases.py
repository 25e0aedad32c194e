"""Benchmark: a gate of 20 live cases that wait on their model (run:
python -m tests.bench.bench_live_cases [GATE_NAME=VALUE ...]).

Starts `gate serve` (on GATE_TEST_DATABASE_URL, else its embedded Postgres) with its default
settings (or those given as arguments, to see what a bound does) and the OpenAI-compatible
fake provider on this host, which answers every call after 1 s. Each case's agent makes 2
calls (a tool call, then its answer), through its worker's model gateway. After one
submission of each bundle that builds its test image, it times, POST to verdict, a gate of
the one case alone and a gate of all 20, and prints their ratio against the 2x target: a
case waiting on its model lends its case slot, so the worker overlaps live cases beyond its
core count, where running them GATE_CASE_CONCURRENCY at a time would take about 20 / that
times one case. Beside it, a gate of 100 such cases, per case against the 20-case gate's.

What bounds the overlap is printed with the figures: the worker's container slots
(GATE_MAX_CASE_CONTAINERS, by default what half the memory holds, and whether memory or the
setting chose them), the gateway's concurrent calls per gate and per project, and its
connections per worker process (each call in flight a thread); the smallest of these below a
gate's case count is its bound, and the most calls the fake provider had in flight at once
shows it. Then the CPU a case costs: its container's (the containers' parent cgroup, read
before and after each gate), and `gate serve`'s, the engine's and Postgres's part (from
/proc), and so the least time the machine's CPUs need for all of a gate's cases: where that
is near the gate's time, the CPUs bound it, whatever the slots.

It also prints the CPU-seconds an invocation paid for its model client before the gateway
(a fresh process importing LiteLLM, as each live invocation did) and now (the runner's
gateway client, the standard library), each measured here in a fresh interpreter. Figures
only: nothing is asserted; they depend on the machine and what else runs on it.
"""

from __future__ import annotations

import bisect
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gate_service.client.api import GateClient
from gate_service.config import (
    MAX_AUTO_CASE_CONTAINERS,
    Settings,
    machine_memory_bytes,
    machine_pid_max,
)
from gate_service.gateway.channel import MAX_PROCESS_CONNECTIONS
from tests.bench.bench_gate import CpuMeter
from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN, bearer, project_token
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.fake_llm import FakeProvider
from tests.fixtures.ports import free_port
from tests.fixtures.projects import bundle_of, write

CASES = 20
REPEATS = 3
MANY = 100  # the larger gate, printed beside the 20-case one
MANY_REPEATS = 2
LATENCY_S = 1.0
TARGET = 2.0
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


class InFlight:
    """The most calls the fake provider had in flight at once, per gate: each call starts
    when the provider decides its answer and ends LATENCY_S later (its sleep)."""

    def __init__(self, provider: FakeProvider) -> None:
        self._decide = tool_then_answer
        self._lock = threading.Lock()
        self.starts: list[float] = []
        provider.decide = self.decide

    def decide(self, body: dict[str, Any]) -> str:
        with self._lock:
            self.starts.append(time.monotonic())
        return self._decide(body)

    def reset(self) -> None:
        with self._lock:
            self.starts = []

    def peak(self) -> int:
        with self._lock:
            starts = sorted(self.starts)
        return max(
            (bisect.bisect_right(starts, s) - bisect.bisect_right(starts, s - LATENCY_S)
             for s in starts),
            default=0,
        )  # fmt: skip


@dataclass(frozen=True)
class Bound:
    name: str
    limit: int  # 0: none

    def binds(self, cases: int) -> bool:
        return 0 < self.limit < cases


def bounds(settings: Settings) -> list[Bound]:
    """What caps the live cases of one gate that wait on their model at once, smallest first."""
    holds = settings.containers_memory_holds()
    if settings.max_case_containers:
        source = f"GATE_MAX_CASE_CONTAINERS={settings.max_case_containers}"
    elif holds is None:
        source = "memory unknown: GATE_CASE_CONCURRENCY"
    else:
        memory_gib = (machine_memory_bytes() or 0) / 1024**3
        source = (
            f"memory: half of {memory_gib:.0f} GiB holds {holds} at "
            f"GATE_CASE_MEMORY_MB={settings.case_memory_mb}"
            + (
                f", capped at {MAX_AUTO_CASE_CONTAINERS}"
                if holds > MAX_AUTO_CASE_CONTAINERS
                else ""
            )
        )
        pids = settings.containers_pids_hold()
        if pids is not None and pids < min(holds, MAX_AUTO_CASE_CONTAINERS):
            source = (
                f"pids: a quarter of pid_max {machine_pid_max()} holds {pids} at "
                f"{settings.case_host_pids()} a case; {source}"
            )
    found = [
        Bound(f"container slots ({source})", settings.case_container_limit()),
        Bound(
            "the gateway's concurrent calls per gate (GATE_GATEWAY_GATE_MAX_CONCURRENT_CALLS)",
            settings.gateway_gate_max_concurrent_calls,
        ),
        Bound(
            "the gateway's concurrent calls per project and worker process "
            "(GATE_GATEWAY_PROJECT_MAX_CONCURRENT_CALLS)",
            settings.gateway_project_max_concurrent_calls,
        ),
        Bound(
            "the gateway's connections per worker process, a thread each in flight "
            "(MAX_PROCESS_CONNECTIONS)",
            MAX_PROCESS_CONNECTIONS,
        ),
    ]
    return sorted(found, key=lambda b: b.limit or sys.maxsize)


def the_bound(found: list[Bound], cases: int) -> str:
    binding = [b for b in found if b.binds(cases)]
    if not binding:
        return f"none below {cases}: all {cases} may wait on their model at once"
    return f"{binding[0].limit} at once: {binding[0].name}"


def judge(client: GateClient, bundle: bytes, cases: int) -> float:
    """Seconds from POST to the verdict."""
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
    overrides = dict(arg.split("=", 1) for arg in sys.argv[1:])
    if any(not name.startswith("GATE_") for name in overrides):
        raise SystemExit("usage: python -m tests.bench.bench_live_cases [GATE_NAME=VALUE ...]")
    server_url = os.environ.get("GATE_TEST_DATABASE_URL")
    database = create_database(server_url) if server_url else None
    data_dir = Path(tempfile.mkdtemp(prefix="gate-bench-live-"))
    src = Path(tempfile.mkdtemp(prefix="gate-bench-live-src-"))
    provider = FakeProvider()
    in_flight = InFlight(provider)
    provider.delay_s = LATENCY_S
    port = free_port()
    settings = {**overrides, "GATE_PORT": str(port)}
    if database:
        settings["GATE_DATABASE_URL"] = database
    proc, log_path = start("serve", data_dir, **settings)
    url = f"http://127.0.0.1:{port}"
    ones: list[float] = []
    gates: list[float] = []
    larges: list[float] = []
    peaks: dict[int, list[int]] = {CASES: [], MANY: []}
    meters = {CASES: CpuMeter(proc.pid), MANY: CpuMeter(proc.pid)}
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
        large = live_project(src / "large", MANY)
        try:
            judge(client, one, 1)  # builds the test image of the one-case bundle
            judge(client, many, CASES)  # and of the 20-case bundle
            judge(client, large, MANY)  # and of the 100-case bundle

            def timed(bundle: bytes, cases: int) -> float:
                """One gate of ``cases``, POST to verdict, with its peak calls and CPU."""
                in_flight.reset()
                with meters[cases]:
                    elapsed = judge(client, bundle, cases)
                peaks[cases].append(in_flight.peak())
                return elapsed

            for _ in range(REPEATS):
                ones.append(judge(client, one, 1))
                gates.append(timed(many, CASES))
            for _ in range(MANY_REPEATS):
                larges.append(timed(large, MANY))
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
    os.environ.update(overrides)  # what `gate serve` ran with
    defaults = Settings()
    one_s, gate_s = statistics.median(ones), statistics.median(gates)
    large_s = statistics.median(larges)
    given = f" with {' '.join(sys.argv[1:])}" if overrides else " defaults"
    print(
        f"{CASES} live cases x 2 model calls, each answered after {LATENCY_S:.0f} s; `gate serve`"
        f"{given} (GATE_CASE_CONCURRENCY={defaults.case_concurrency}, container slots "
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
    print(
        f"  all {MANY}, POST to verdict: median {large_s:.2f} s "
        f"({', '.join(f'{g:.2f}' for g in larges)}): {large_s / MANY:.3f} s per case against "
        f"{gate_s / CASES:.3f} s per case of the {CASES}-case gate "
        f"({large_s / MANY / (gate_s / CASES):.2f}x)"
    )
    found = bounds(defaults)
    print("  what caps the cases of one gate waiting on their model at once, smallest first:")
    for bound in found:
        print(f"    {bound.limit or 'no limit'}: {bound.name}")
    for cases in (CASES, MANY):
        print(
            f"  the bound of a {cases}-case gate: {the_bound(found, cases)}; most calls in "
            f"flight at the provider: {', '.join(str(p) for p in peaks[cases])}"
        )
    cores = os.cpu_count() or 1
    for cases, runs, gate_time, timed_gates in (
        (CASES, REPEATS, gate_s, gates),
        (MANY, MANY_REPEATS, large_s, larges),
    ):
        used = {k: v / runs / cases for k, v in meters[cases].used.items()}
        container = used["containers"]  # NaN where no cgroup of the containers is found
        own = container + used["server"] + used["engine"] + used["postgres"]
        floor = cases * own / cores
        print(
            f"  CPU-seconds per case of the {cases}-case gate: its container {container:.3f}"
            f"{' (no cgroup of the containers found)' if math.isnan(container) else ''}, "
            f"`gate serve` and its worker {used['server']:.3f} (the "
            f"gateway's calls among it), engine {used['engine']:.3f}, Postgres "
            f"{used['postgres']:.3f}: {own:.3f} in all; the machine {used['total']:.3f} (with "
            "whatever else runs)"
        )
        target = f"; the {TARGET:.0f}x target: {TARGET * one_s:.2f} s" if cases == CASES else ""
        print(
            f"    so {cases} cases need {floor:.2f} s of {cores} CPUs at least, "
            f"{floor / gate_time:.0%} of the gate's {gate_time:.2f} s{target}"
        )
        # An average over the gate: its CPUs run near full while its cases start (85-95% in
        # a timeline of the slots, 2026-12-07) and nearly idle while its last cases wait on
        # the provider, so a figure well under 100% can still be a gate the CPUs bound.
        busy = used["total"] * cases / (cores * statistics.mean(timed_gates))
        print(f"    the machine's {cores} CPUs were {busy:.0%} busy over the gate")
    before = import_cpu_seconds("import litellm")
    after = import_cpu_seconds("import gate_runner.models")
    print(
        f"  CPU-seconds per live invocation for its model client: before (LiteLLM imported in "
        f"the invocation) {before:.2f} s, now (the gateway client) {after:.2f} s"
    )


if __name__ == "__main__":
    main()

"""Every benchmark in one run: ``python -m tests.bench``.

Each bench runs in its own process, one after the other (they share the machine, so never at
once), under the environment given here (GATE_TEST_DATABASE_URL is used where a bench needs
Postgres). Before each bench's own figures comes what it measures and its target; a bench
that cannot run here (a missing tool, no Docker) is reported and the others still run.
Nothing is asserted: the figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

BENCHES: list[tuple[str, str]] = [
    (
        "bench_case_start",
        "one case container, start to parsed result, against `python -c pass` in the same "
        "image: target: the runner's start-up no more than what it must import and run",
    ),
    (
        "bench_upload",
        "`gate api` resident memory while receiving uploads, against a 1 MiB upload: "
        "target: a refused 200 MiB stream grows it no more than the baseline (a flat receiver)",
    ),
    (
        "bench_status",
        "status reads: GET a 20-case gate at >= 0.5x the /healthz rate; 500 idle long-polls "
        "at <= 10% API CPU with /healthz p99 <= 50 ms",
    ),
    (
        "bench_result_storage",
        "/healthz of `gate serve` while its worker redacts (100 secrets of ~1 KB) and stores an "
        "8 MB result that nearly matches every secret, against idle /healthz: target p99 < 50 ms",
    ),
    (
        "bench_gate",
        "a warm 20-case gate, POST to verdict, for a project without and with `import "
        "connic`: targets within 1.25x of 20 bare `docker run`s of its image and within 1.15x "
        "of 20 `import connic` containers (both as many at a time as the gate runs cases); a "
        "first gate at most 1 s over a warm one; the first gate after a restart, submitted when "
        "/readyz first answers 200, at most 1 s over a warm one (also printed from /healthz)",
    ),
    (
        "bench_gate_scale",
        "per-case cost of warm gates of 20 and 500 one-run cases and of one `runs: 100` case, "
        "against the 20-case gate: target <= 1.2x; GET of the 500-case gate: p50 < 50 ms",
    ),
    (
        "bench_engines",
        "gates per minute with one worker and with two, each on its own private Docker engine "
        "under one queue (on one machine: the coordination cost, not a speed-up)",
    ),
    (
        "bench_live_cases",
        "a gate of 20 live cases, each 2 model calls answered after 1 s, against one such "
        "case alone: target <= 2x, with a 100-case gate per case beside it and what bounds the "
        "overlap (memory or the gateway); and an invocation's model-client CPU before and "
        "after LiteLLM left the runner",
    ),
    (
        "bench_early_stop",
        "early stop, the runner in-process: a failing 10-run case's time against the same "
        "case with every invocation run, and the model calls a failing live 10-run case saves",
    ),
    (
        "bench_noisy_pages",
        "a project's one-case gate while another project's cases make the gateway read 2 MiB "
        "hostile pages through web_read_page, against the same gate on the idle service: "
        "target <= 2x",
    ),
]


def main() -> int:
    only = set(sys.argv[1:])
    failed = []
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the start")
    for name, what in BENCHES:
        if only and name not in only:
            continue
        print(f"\n== {name}: {what}", flush=True)
        started = time.monotonic()
        code = subprocess.run([sys.executable, "-m", f"tests.bench.{name}"], check=False).returncode
        took = time.monotonic() - started
        print(f"-- {name}: {'done' if code == 0 else f'FAILED (exit {code})'} in {took:.0f} s")
        if code != 0:
            failed.append(name)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    if failed:
        print(f"benches that did not run to the end: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

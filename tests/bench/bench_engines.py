"""Benchmark: gates per minute with one worker and with two, each worker on its own Docker
engine, all under one queue (run as root: python -m tests.bench.bench_engines).

Starts two private engines (tests/fixtures/engines.py) holding this checkout's runner
image, `gate api` on GATE_TEST_DATABASE_URL (a fresh database per round), and then one
`gate worker` (on the first engine) or two (one per engine). Each round submits GATES gates of
CASES one-run cases of the calc tool agent at once and times first POST to last verdict;
the test image is built on each engine by a warm-up gate first, so the rounds are warm. The
gates are all one project's, so GATE_MAX_RUNNING_GATES_PER_PROJECT is raised to GATES: at its
default of 2, the first worker holding two gates leaves the second nothing to claim.

On one machine both engines share its CPUs, so the ratio shows what the second worker and
the shared queue cost or save there, not the speed-up of two hosts. Nothing is asserted.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import docker

from gate_service.client.api import GateClient
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.cluster import Cluster, engines_with_the_runner
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.engines import PrivateDaemon, can_start_engines
from tests.fixtures.projects import bundle_of, sleepy_project

GATES = 10
CASES = 4


def has_test_image(daemon: PrivateDaemon, sha: str) -> bool:
    client = docker.DockerClient(base_url=daemon.url, timeout=60)
    try:
        return bool(client.images.list(filters={"label": f"gate.bundle={sha}"}))
    finally:
        client.close()


def round_of(
    workers: int,
    engines: list[PrivateDaemon],
    server_url: str,
    work: Path,
    bundle: bytes,
    **settings: str,
) -> float:
    """Gates per minute with ``workers`` workers (one per engine), started with ``settings``."""
    database = create_database(server_url)
    cluster = Cluster(database, work / f"round-{workers}-{len(settings)}", lease_seconds=30)
    try:
        cluster.start_api()
        for daemon in engines[:workers]:
            # All the gates are one project's: its cap (2 by default) would keep a second
            # worker idle while the first holds two of them.
            cluster.start_worker(daemon, GATE_MAX_RUNNING_GATES_PER_PROJECT=str(GATES), **settings)
        client = GateClient(cluster.url, token=ADMIN_TOKEN)
        try:
            # Warm: every engine that will judge has the test image before the clock starts
            # (which worker claims a warm-up gate is the queue's choice: submit until each has
            # built it).
            sha = hashlib.sha256(bundle).hexdigest()
            for _ in range(20):
                if all(has_test_image(daemon, sha) for daemon in engines[:workers]):
                    break
                warm = [client.submit(bundle)["id"] for _ in range(workers)]
                for gate_id in warm:
                    client.wait(gate_id, timeout_s=900)
            else:
                logs = [p.read_text()[-1500:] for p in cluster.work.glob("worker-*/worker.log")]
                raise RuntimeError(f"a worker never built the test image on its engine: {logs}")
            started = time.monotonic()
            ids = [client.submit(bundle)["id"] for _ in range(GATES)]
            ends = [client.wait(gate_id, timeout_s=1800)["status"] for gate_id in ids]
            took = time.monotonic() - started
        finally:
            client.close()
        if set(ends) != {"passed"}:
            raise RuntimeError(f"not every gate passed: {ends}")
        return GATES / took * 60
    finally:
        cluster.stop()
        drop_database(server_url, database)


def main() -> int:
    server_url = os.environ.get("GATE_TEST_DATABASE_URL")
    if not server_url or not can_start_engines():
        print("needs GATE_TEST_DATABASE_URL, root and the dockerd binary", file=sys.stderr)
        return 1
    # The runner image loaded into the private engines is the one its workers look for only
    # when both agree on the base (the tests pin it too: tests/conftest.py).
    os.environ.setdefault("GATE_BASE_IMAGE_SOURCE", "debootstrap")
    work = Path(tempfile.mkdtemp(prefix="gate-bench-engines-"))
    cpus = os.cpu_count() or 1  # each worker's default GATE_CASE_CONCURRENCY
    try:
        bundle = bundle_of(sleepy_project(work / "p", CASES, failing=False, sleep=0))
        with engines_with_the_runner(2, work) as engines:
            one = round_of(1, engines, server_url, work, bundle)
            two = round_of(2, engines, server_url, work, bundle)
            # The same case slots in all as the one worker has, split between the two.
            halves = round_of(
                2, engines, server_url, work, bundle, GATE_CASE_CONCURRENCY=str(max(1, cpus // 2))
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{GATES} gates of {CASES} one-run cases, submitted at once, {cpus} CPUs")
    print(f"  one worker on one engine:          {one:6.1f} gates/minute")
    print(
        f"  two workers, one on each engine:   {two:6.1f} gates/minute ({two / one:.2f}x; "
        f"{2 * cpus} case slots in all)"
    )
    print(
        f"  the same, {max(1, cpus // 2)} case slot(s) each:    {halves:6.1f} gates/minute "
        f"({halves / one:.2f}x; {2 * max(1, cpus // 2)} in all, as the one worker has {cpus})"
    )
    print(
        "  (both engines share this machine's CPUs: the ratio is the cost or gain of a second "
        "worker and the shared queue here, not the speed-up of a second host)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

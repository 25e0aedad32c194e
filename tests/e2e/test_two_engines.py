"""Two Docker engines under one queue: a `gate worker` on each (DOCKER_HOST), one `gate api`,
one Postgres, as two hosts would run them. One worker is killed mid-gate; the other finishes
every gate, with the right verdicts, and the dead worker's engine is left clean once its
worker comes back.

"Each case runs on one engine": a case is judged once, by the worker that ran it to its end.
A case the killed worker had in flight (its container started, no verdict stored) is the one
exception by design: not judged, it runs again where its gate is resumed.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from gate_service.client.api import GateClient
from gate_service.db import make_engine, make_sessionmaker
from gate_service.models import Case, Job
from tests.fixtures.auth import ADMIN_TOKEN
from tests.fixtures.cluster import (
    Cluster,
    StartedCases,
    case_containers,
    engines_with_the_runner,
)
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.engines import can_start_engines
from tests.fixtures.projects import bundle_of, sleepy_project

pytestmark = pytest.mark.docker

GATES = 20
CASES = 3


def test_a_killed_workers_gates_are_finished_on_the_other_engine_and_its_engine_left_clean(
    docker_engine: None, pg_server_url: str, tmp_path: Path
) -> None:
    if not can_start_engines():
        pytest.skip("private engines need root and the dockerd binary")
    database = create_database(pg_server_url)
    cluster = Cluster(database, tmp_path / "cluster")
    client = None
    db = make_engine(database)
    sessions = make_sessionmaker(db)
    try:
        with engines_with_the_runner(2, tmp_path) as (a, b):
            started_on = {a.url: StartedCases(a), b.url: StartedCases(b)}
            cluster.start_api()
            worker_a = cluster.start_worker(a)
            cluster.start_worker(b)
            client = GateClient(cluster.url, token=ADMIN_TOKEN)
            bundles = [
                bundle_of(sleepy_project(tmp_path / f"p{failing}", CASES, failing=failing))
                for failing in (False, True)
            ]
            gate_ids = [client.submit(bundles[i % 2])["id"] for i in range(GATES)]

            # Mid-gate: A has judged a case and has one running now. Then it dies (SIGKILL:
            # no cleanup of its own), its case containers left on its engine.
            deadline = time.monotonic() + 300
            while not (started_on[a.url].ids and case_containers(a, status="running")):
                assert time.monotonic() < deadline, "worker A never ran a case"
                assert worker_a.poll() is None, "worker A exited"
                time.sleep(0.1)
            worker_a.kill()
            worker_a.wait()
            in_flight = {c.labels["gate.case_id"] for c in case_containers(a)}

            finished = [client.wait(g, timeout_s=600) for g in gate_ids]
            for i, gate in enumerate(finished):
                assert gate["status"] == ("failed" if i % 2 else "passed"), gate
                assert gate["total_cases"] == CASES and gate["judged_cases"] == CASES
                for case in gate["cases"]:
                    if i % 2:
                        assert "output.sum ==" in case["failure_reason"], case
                    else:
                        assert case["status"] == "passed", case

            time.sleep(1)  # the last events reach the readers
            for watch in started_on.values():
                watch.close()
            on_a, on_b = Counter(started_on[a.url].ids), Counter(started_on[b.url].ids)
            every_case = {c["id"] for gate in finished for c in gate["cases"]}
            assert set(on_a) | set(on_b) == every_case
            assert on_a and on_b, "both engines judged cases"
            # Only what A had in flight when it died ran on both engines, and nothing ran
            # twice on one engine.
            assert set(on_a) & set(on_b) <= in_flight, (set(on_a) & set(on_b)) - in_flight
            assert max(on_a.values()) == 1 and max(on_b.values()) == 1
            # None stuck: every job ended, and each case holds one verdict.
            with sessions() as s:
                ids = [uuid.UUID(g) for g in gate_ids]
                assert {j.state for j in s.scalars(select(Job).where(Job.gate_id.in_(ids)))} == {
                    "done"
                }
                statuses = Counter(
                    s.scalars(select(Case.status).where(Case.gate_id.in_(ids))).all()
                )
                assert statuses == Counter(
                    {"passed": CASES * GATES // 2, "failed": CASES * GATES // 2}
                )

            # A's worker comes back: what its dead predecessor left there is removed at its
            # start (the lease it held expired), and nothing of ours stays on that engine.
            assert case_containers(a), "the killed worker left its case container(s)"
            cluster.start_worker(a)
            deadline = time.monotonic() + 60
            while case_containers(a):
                assert time.monotonic() < deadline, [c.labels for c in case_containers(a)]
                time.sleep(0.5)
            assert not case_containers(b)
    finally:
        if client is not None:
            client.close()
        cluster.stop()
        db.dispose()
        drop_database(pg_server_url, database)

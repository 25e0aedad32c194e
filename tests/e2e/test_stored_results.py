"""Stored results through the real service and engine (issue 17, items 3 and 4).

`gate serve` runs on a database of this test's own, so the test can read what Postgres holds
for each run, and judges in real case containers what tools return: a 10 MB string, 8 MB of
distinct items, and values Postgres cannot store (NaN, infinities, a lone surrogate, NUL).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gate_service.client.api import GateClient
from gate_service.config import Settings
from gate_service.db import make_engine, make_sessionmaker, session_scope
from gate_service.models import utcnow
from gate_service.stored_runs import MARK
from gate_service.worker.retention import run_retention
from tests.e2e.conftest import running
from tests.fixtures.auth import ADMIN_TOKEN, bearer
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.outputs import (
    BIG_ITEMS,
    TEN_MB,
    UNSTORABLE_OUTPUT,
    big_output_project,
    unstorable_output_project,
)
from tests.fixtures.projects import bundle_of, calculator_project

pytestmark = pytest.mark.docker

RUN_CAP = 1024 * 1024  # the default GATE_MAX_STORED_RUN_BYTES
QUOTA = 512 * 1024  # more than all but the one large run store, less than with it


@pytest.fixture
def served(
    docker_engine: None, pg_server_url: str, gate_url: str, tmp_path: Path
) -> Iterator[tuple[str, sessionmaker[Session]]]:
    """`gate serve` on its own database (gate_url first: the images are ready by then)."""
    database = create_database(pg_server_url)
    engine = make_engine(database)
    try:
        with running(
            "serve",
            tmp_path,
            GATE_DATABASE_URL=database,
            GATE_MAX_RESULT_BYTES_PER_PROJECT=str(QUOTA),
        ) as serve:
            yield serve.url, make_sessionmaker(engine)
    finally:
        engine.dispose()
        drop_database(pg_server_url, database)


def rows(sessions: sessionmaker[Session], gate_id: str) -> dict[str, dict[str, Any]]:
    with session_scope(sessions) as s:
        found = s.execute(
            text(
                "SELECT c.test_name, r.id, r.stored_bytes, row_to_json(r)::text AS row, "
                "j.attempts FROM runs r JOIN cases c ON c.id = r.case_id "
                "JOIN jobs j ON j.gate_id = c.gate_id WHERE c.gate_id = :g"
            ),
            {"g": uuid.UUID(gate_id)},
        ).all()
    return {r.test_name: dict(r._mapping) for r in found}


def test_large_and_unstorable_outputs_through_the_real_service(
    served: tuple[str, sessionmaker[Session]], tmp_path: Path
) -> None:
    url, sessions = served
    client = GateClient(url, token=ADMIN_TOKEN)
    http = httpx.Client(base_url=url, headers=bearer(ADMIN_TOKEN), timeout=120)
    try:
        # Both admitted while the project stores nothing.
        big_id = client.submit(bundle_of(big_output_project(tmp_path / "big")))["id"]
        odd_id = client.submit(bundle_of(unstorable_output_project(tmp_path / "odd")))["id"]
        big, odd = client.wait(big_id, timeout_s=900), client.wait(odd_id, timeout_s=900)

        # Item 3: each run within the cap, each large value stored once, cuts marked.
        assert big["status"] == "passed", big
        stored = rows(sessions, big_id)
        assert all(r["stored_bytes"] <= RUN_CAP for r in stored.values())
        assert all(r["attempts"] == 1 for r in stored.values())
        items = stored["returns_eight_megabytes_of_items"]
        assert items["row"].count("item-0007-") == 1
        run = http.get(f"/v1/runs/{items['id']}").json()
        assert len(run["output"]) == BIG_ITEMS and all(MARK.search(i) for i in run["output"])
        spans = {s["type"]: s for s in run["traces"]}
        assert spans["tool_call"]["metadata"]["result"] == run["output"]
        assert spans["outbound"]["metadata"]["output"] == run["output"]
        assert "GATE_MAX_STORED_RUN_BYTES" in run["failure_reason"]
        string = stored["returns_ten_megabytes"]
        assert string["row"].count("x" * 1000) == 1
        run = http.get(f"/v1/runs/{string['id']}").json()
        assert run["output"] == "x" * 1024 + f"…[{TEN_MB - 1024} bytes cut]"
        assert "the stored result was cut" in run["failure_reason"]

        # Item 4: judged on the assertions, stored in the documented form, not retried.
        assert (odd["status"], odd["phase"]) == ("failed", "done"), odd
        by_name = {c["test_name"]: c for c in odd["cases"]}
        assert by_name["is_judged_on_its_assertion"]["status"] == "passed"
        assert by_name["fails_on_its_assertion"]["status"] == "failed"
        odd_rows = rows(sessions, odd_id)
        assert all(r["attempts"] == 1 for r in odd_rows.values())
        run = http.get(f"/v1/runs/{odd_rows['fails_on_its_assertion']['id']}").json()
        assert run["output"] == UNSTORABLE_OUTPUT

        # The quota: the project now stores more than it may; the next gate is refused.
        other = bundle_of(calculator_project(tmp_path / "calc", failing=False))
        refused = http.post("/v1/gates", files={"bundle": ("b.tgz", other)})
        assert refused.status_code == 429, refused.text
        assert "GATE_MAX_RESULT_BYTES_PER_PROJECT" in refused.json()["detail"]
        assert f"the limit is {QUOTA} bytes" in refused.json()["detail"]

        # Retention deletes the old gates (a month on) and the project has room again.
        settings = Settings(database_url="unused")
        report = run_retention(
            sessions, settings, now=utcnow() + timedelta(days=31), exclusive=False
        )
        assert report.projects["default"].gates == 2
        admitted = http.post("/v1/gates", files={"bundle": ("b.tgz", other)})
        assert admitted.status_code == 202, admitted.text
        assert client.wait(admitted.json()["id"], timeout_s=900)["status"] == "passed"
    finally:
        http.close()
        client.close()

"""The scale-out shape: `gate api` and two `gate worker`s sharing one configured Postgres."""

from pathlib import Path

import pytest

from tests.e2e.conftest import free_port, start, stop, wait_ready
from tests.e2e.test_gate_e2e import judge
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.projects import bundle_of, calculator_project

pytestmark = pytest.mark.docker


def test_api_and_workers_as_separate_processes(
    docker_engine: None, pg_server_url: str, gate_url: str, tmp_path: Path
) -> None:
    # gate_url first: the serve fixture has prepared the images, so workers start quickly.
    database = create_database(pg_server_url)
    port = free_port()
    procs = []
    try:
        api, api_log = start("api", tmp_path, GATE_DATABASE_URL=database, GATE_PORT=str(port))
        procs.append(api)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, api, api_log)
        for i in range(2):
            (tmp_path / f"w{i}").mkdir()
            worker, _ = start("worker", tmp_path / f"w{i}", GATE_DATABASE_URL=database)
            procs.append(worker)
        gates = [
            judge(url, bundle_of(calculator_project(tmp_path / f"p{i}", failing=i == 1)))
            for i in range(2)
        ]
        assert [g["status"] for g in gates] == ["passed", "failed"]
    finally:
        for proc in procs:
            stop(proc)
        drop_database(pg_server_url, database)

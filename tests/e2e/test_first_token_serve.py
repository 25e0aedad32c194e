"""`gate serve`'s first start shows its admin token last: after the API listens and after its
worker process has started its workers (whose start-up lines would otherwise follow it), framed,
naming the file it saved it to (tests/integration/test_first_token.py: `gate api`)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.e2e.conftest import STARTUP_SECONDS
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.ports import free_port
from tests.integration.test_first_token import (
    check_notice,
    first_start,
    notice_in,
    stop,
    wait_for_notice,
)


def test_gate_serve_shows_its_first_token_after_its_worker_process_started(
    docker_engine: None, pg_server_url: str, tmp_path: Path
) -> None:
    database = create_database(pg_server_url)  # the images are the engine's, kept across runs
    port = free_port()
    proc, log_path = first_start(
        "serve", tmp_path / "data", GATE_DATABASE_URL=database, GATE_PORT=str(port)
    )
    try:
        wait_for_notice(proc, log_path, seconds=STARTUP_SECONDS)
        time.sleep(3)  # anything start-up printed after it would be in the log by now
        log = log_path.read_text()
        notice = notice_in(log)
        assert notice is not None
        before = "\n".join(notice.before)
        assert f"Uvicorn running on http://127.0.0.1:{port}" in before
        assert "embedded worker process" in before, before[-3000:]
        # The worker process's own start-up: its workers (host:pid:id) have begun.
        assert re.search(r"worker \S+:\d+:[0-9a-f]{8} started", before), before[-3000:]
        assert [line for line in notice.after if line.strip()] == [], log[-3000:]
        token = check_notice(notice, tmp_path / "data")
        assert log.count(token) == 1
    finally:
        stop(proc)
        drop_database(pg_server_url, database)

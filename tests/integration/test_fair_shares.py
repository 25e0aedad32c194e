"""Fair shares of a real `gate api` process's upload and long-poll slots (issue 17 item 6).

Each test attacks through the real service: `gate api` in its own process on a database of
this test's own, real sockets, one project flooding and another going about its business.
No worker runs, so every gate stays queued and every long-poll has something to wait on.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import start, stop, wait_ready
from tests.fixtures.auth import ADMIN_TOKEN, bearer, project_token
from tests.fixtures.db import create_database, drop_database
from tests.fixtures.live import MULTIPART_HEAD, stream_upload
from tests.fixtures.ports import free_port
from tests.fixtures.projects import bundle_of, calculator_project
from tests.fixtures.waiting import wait_until

HOST = "127.0.0.1"


@contextmanager
def api(pg_server_url: str, data_dir: Path, **settings: str) -> Iterator[int]:
    """`gate api` with these GATE_ settings on a fresh database; its port."""
    database = create_database(pg_server_url)
    port = free_port()
    proc, log_path = start(
        "api", data_dir, GATE_DATABASE_URL=database, GATE_PORT=str(port), **settings
    )
    try:
        wait_ready(f"http://{HOST}:{port}", proc, log_path)
        yield port
    finally:
        stop(proc)
        drop_database(pg_server_url, database)


def client(port: int, token: str) -> httpx.Client:
    return httpx.Client(base_url=f"http://{HOST}:{port}", headers=bearer(token), timeout=60)


def tokens(port: int, *projects: str) -> list[str]:
    with client(port, ADMIN_TOKEN) as admin:
        return [project_token(admin, name, ["submit", "read"]) for name in projects]


def submit(c: httpx.Client, data: bytes) -> httpx.Response:
    return c.post("/v1/gates", files={"bundle": ("b.tgz", data)})


def submit_test_run(c: httpx.Client, project: str, data: bytes) -> httpx.Response:
    """The connic CLI's route: the archive base64 in a JSON body."""
    return c.post(
        f"/v1/projects/{project}/test-runs",
        json={"files_data": base64.b64encode(data).decode()},
    )


def trickle(
    pool: ThreadPoolExecutor, port: int, token: str, stop_sending: threading.Event, **kw: Any
) -> Future[tuple[int, int, bytes]]:
    """A multipart upload (by default) sending one byte every ``pause_seconds`` (2 s)."""
    kw.setdefault("pause_seconds", 2.0)
    return pool.submit(stream_upload, HOST, port, 100_000, 1, token=token, stop=stop_sending, **kw)


@pytest.fixture
def bundle(tmp_path: Path) -> bytes:
    return bundle_of(calculator_project(tmp_path / "p", failing=False))


def test_slow_uploads_of_one_project_take_only_its_share_of_the_slots(
    pg_server_url: str, tmp_path: Path, bundle: bytes
) -> None:
    """16 uploads sending a byte every 2 s (the reported attack): 4 hold project A's share of
    the 8 upload slots, 12 are refused 429 at once, and project B's uploads, through both
    routes, are accepted meanwhile. No minimum rate here, so nothing cuts A's four."""
    quit_sending = threading.Event()
    with (
        api(pg_server_url, tmp_path, GATE_UPLOAD_MIN_BYTES_PER_SECOND="0") as port,
        ThreadPoolExecutor(max_workers=16) as pool,
    ):
        a_token, b_token = tokens(port, "alpha", "beta")
        try:
            slow = [trickle(pool, port, a_token, quit_sending) for _ in range(16)]
            wait_until(lambda: sum(f.done() for f in slow) >= 12, "12 refusals", seconds=60)
            refused = [f.result() for f in slow if f.done()]
            assert [status for _, status, _ in refused] == [429] * 12
            detail = httpx.Response(429, content=refused[0][2]).json()["detail"]
            assert "project 'alpha' already has 4 uploads in progress" in detail
            assert "GATE_MAX_CONCURRENT_UPLOADS_PER_PROJECT" in detail
            with client(port, a_token) as alpha:
                again = submit(alpha, bundle)
            assert again.status_code == 429, again.text
            assert int(again.headers["Retry-After"]) > 0
            with client(port, b_token) as beta:
                accepted = submit(beta, bundle)
                assert accepted.status_code == 202, accepted.text
                run = submit_test_run(beta, "beta", bundle)
                assert run.status_code == 202, run.text
            # A's four still hold their slots: B was accepted while they did.
            assert sum(not f.done() for f in slow) == 4
        finally:
            quit_sending.set()


def test_an_upload_slower_than_the_minimum_rate_is_cut_with_408_and_its_slot_freed(
    pg_server_url: str, tmp_path: Path, bundle: bytes
) -> None:
    quit_sending = threading.Event()
    with (
        api(pg_server_url, tmp_path, GATE_UPLOAD_RATE_GRACE_SECONDS="2") as port,
        ThreadPoolExecutor(max_workers=4) as pool,
    ):
        (a_token,) = tokens(port, "alpha")
        try:

            def slow(**kw: Any) -> Future[tuple[int, int, bytes]]:
                return trickle(pool, port, a_token, quit_sending, pause_seconds=0.5, **kw)

            # The project's whole share (4 of 8 slots), a byte every half second: 4 bytes in
            # a 2 s stretch where the default minimum (16 KiB/s) needs 32 KiB.
            uploads = [
                slow(),
                slow(),
                # 64 KiB at once, then a trickle: its first stretch is fine, its second is not
                # (the rate is measured per stretch, not as an average since the start).
                slow(first=MULTIPART_HEAD + b"\0" * 65536),
                # The connic route's JSON body is read the same way.
                slow(
                    path="/v1/projects/alpha/test-runs",
                    content_type="application/json",
                    first=b'{"files_data": "',
                    fill=b"A",
                ),
            ]
            answers = [f.result(timeout=120) for f in uploads]
        finally:
            quit_sending.set()
        assert [status for _, status, _ in answers] == [408] * 4
        body = httpx.Response(408, content=answers[0][2]).json()
        assert body["error"] == "RequestTimeout"
        assert "slower than the minimum of 16384 bytes/s" in body["detail"]
        assert "GATE_UPLOAD_MIN_BYTES_PER_SECOND" in body["detail"]
        assert "GATE_UPLOAD_RATE_GRACE_SECONDS" in body["detail"]
        front_loaded = httpx.Response(408, content=answers[2][2]).json()["problems"][0]
        assert front_loaded["received_bytes"] > 65536 > front_loaded["bytes_in_window"]
        # The cut uploads gave their slots back: the project's share is free again.
        with client(port, a_token) as alpha:
            for _ in range(4):
                accepted = submit(alpha, bundle)
                assert accepted.status_code == 202, accepted.text


def test_long_polls_of_one_project_take_only_its_share_of_the_slots(
    pg_server_url: str, tmp_path: Path, bundle: bytes
) -> None:
    """30 long-polls of project A against 20 slots: 10 wait (A's share), 20 are refused 429
    at once, and project B's long-poll waits and answers as usual meanwhile."""
    with (
        api(pg_server_url, tmp_path, GATE_MAX_CONCURRENT_LONG_POLLS="20") as port,
        ThreadPoolExecutor(max_workers=30) as pool,
    ):
        a_token, b_token = tokens(port, "alpha", "beta")
        with client(port, a_token) as alpha, client(port, b_token) as beta:
            a_gate = submit(alpha, bundle).json()["id"]
            b_gate = submit(beta, bundle).json()["id"]
            a_etag = alpha.get(f"/v1/gates/{a_gate}").headers["ETag"]
            b_etag = beta.get(f"/v1/gates/{b_gate}").headers["ETag"]

            def long_poll_a() -> int:
                with client(port, a_token) as c:
                    answer = c.get(f"/v1/gates/{a_gate}?wait=15", headers={"If-None-Match": a_etag})
                    return answer.status_code

            polls = [pool.submit(long_poll_a) for _ in range(30)]
            wait_until(lambda: sum(f.done() for f in polls) >= 20, "20 refusals", seconds=60)
            assert sorted(f.result() for f in polls if f.done()) == [429] * 20
            # 304: it waited its second out, holding a slot (refused, it would be 429/503).
            b_poll = beta.get(f"/v1/gates/{b_gate}?wait=1", headers={"If-None-Match": b_etag})
            assert b_poll.status_code == 304, b_poll.text
            assert sum(not f.done() for f in polls) == 10  # A's share still waiting
            assert sorted(f.result() for f in polls) == [304] * 10 + [429] * 20

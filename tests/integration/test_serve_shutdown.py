"""The embedded Postgres ends with the `gate` process that started it, on every exit path,
and a restart adopts or replaces one a killed `gate` left behind (issue #12 item 5).

`gate api` with no GATE_DATABASE_URL starts the same embedded server as `gate serve`
(cli/server.py `_database_url` and `_lifetime`), without needing Docker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil
import pytest

from gate_service.cli import server
from tests.e2e.conftest import free_port, start, stop, wait_ready


def postgres_pids(data_dir: Path) -> list[int]:
    """Processes whose command line names ``data_dir`` (scanning /proc, as an operator would)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and str(data_dir).encode() in argv:
            found.append(int(entry.name))
    return sorted(found)


def wait_gone(pids: list[int], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    # Whatever a failing test left: never leak a server.
    for pid in postgres_pids(tmp_path / "postgres"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_api(data_dir: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    proc, log_path = start("api", data_dir, GATE_PORT=str(port))
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, log_path)
    return proc, url, log_path


@pytest.mark.postgres  # gate api's embedded server
def test_sigterm_stops_the_embedded_postgres(data_dir: Path) -> None:
    pgdata = data_dir / "postgres"
    proc, _url, log_path = run_api(data_dir)
    running = postgres_pids(pgdata)
    assert running, "the embedded server should run while `gate api` does"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
    wait_gone(running)
    assert postgres_pids(pgdata) == [], log_path.read_text()[-3000:]


@pytest.mark.postgres  # gate api's embedded server
def test_sigint_stops_the_embedded_postgres(data_dir: Path) -> None:
    pgdata = data_dir / "postgres"
    proc, _url, log_path = run_api(data_dir)
    running = postgres_pids(pgdata)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    wait_gone(running)
    assert postgres_pids(pgdata) == [], log_path.read_text()[-3000:]


@pytest.mark.postgres  # gate api's embedded server
def test_a_restart_adopts_the_orphan_of_a_killed_gate(data_dir: Path) -> None:
    pgdata = data_dir / "postgres"
    proc, _url, _log = run_api(data_dir)
    # Its watchdog first (pg.py; it would stop the server), as when both are killed at once
    # or an older gate left the server: then SIGKILL, so no cleanup runs; an orphan is left.
    (watchdog,) = [c for c in psutil.Process(proc.pid).children() if "--watch" in c.cmdline()]
    orphan = [p for p in postgres_pids(pgdata) if p != watchdog.pid]
    watchdog.kill()  # SIGKILL: it runs no code of its own again (its parent reaps it)
    proc.kill()
    proc.wait()
    assert postgres_pids(pgdata) == orphan

    proc, url, log_path = run_api(data_dir)
    try:
        # Adopted, not a second server beside it (the new gate's watchdog aside), and it serves.
        (new_watchdog,) = [
            c for c in psutil.Process(proc.pid).children() if "--watch" in c.cmdline()
        ]
        assert [p for p in postgres_pids(pgdata) if p != new_watchdog.pid] == orphan
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    finally:
        stop(proc)
    wait_gone(orphan)
    # The dead first holder no longer keeps the adopted server alive.
    assert postgres_pids(pgdata) == [], log_path.read_text()[-3000:]


@pytest.mark.postgres  # gate api's embedded server
def test_a_restart_replaces_a_dead_server_and_a_foreign_pidfile(data_dir: Path) -> None:
    pgdata = data_dir / "postgres"
    proc, _url, _log = run_api(data_dir)
    orphan = postgres_pids(pgdata)
    proc.kill()
    proc.wait()
    for pid in orphan:
        os.kill(pid, signal.SIGKILL)
    wait_gone(orphan)
    # postmaster.pid now names a live process that is not postgres (a reused pid).
    pidfile = pgdata / "postmaster.pid"
    lines = pidfile.read_text().splitlines()
    pidfile.write_text("\n".join([str(os.getpid()), *lines[1:]]) + "\n")

    proc, url, log_path = run_api(data_dir)
    try:
        fresh = postgres_pids(pgdata)
        assert fresh and not set(fresh) & set(orphan)
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    finally:
        stop(proc)
    wait_gone(fresh)
    assert postgres_pids(pgdata) == [], log_path.read_text()[-3000:]


def start_up(body: Callable[[ExitStack], None]) -> None:
    """What serve() and api() do: the body registers its cleanups on the lifetime's stack."""
    with server._lifetime() as cleanup:
        body(cleanup)


def test_a_failure_at_start_up_stops_what_was_started() -> None:
    stopped: list[str] = []

    def body(cleanup: ExitStack) -> None:
        cleanup.callback(stopped.append, "postgres")
        raise RuntimeError("the migration failed")

    with pytest.raises(RuntimeError):
        start_up(body)
    assert stopped == ["postgres"]


def test_a_signal_during_start_up_runs_the_cleanup() -> None:
    stopped: list[str] = []
    previous = signal.getsignal(signal.SIGTERM)

    def body(cleanup: ExitStack) -> None:
        cleanup.callback(stopped.append, "postgres")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted by the handler

    with pytest.raises(SystemExit) as exit_info:
        start_up(body)
    assert exit_info.value.code == 0
    assert stopped == ["postgres"]
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_second_signal_does_not_cut_the_cleanup_short() -> None:
    stopped: list[str] = []

    def slow_stop() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives during the cleanup: only logged
        time.sleep(0.1)
        stopped.append("postgres")

    def body(cleanup: ExitStack) -> None:
        cleanup.callback(slow_stop)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    with pytest.raises(SystemExit):
        start_up(body)
    assert stopped == ["postgres"]

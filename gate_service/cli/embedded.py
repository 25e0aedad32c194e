"""`gate serve`'s workers: a `gate worker` child process, never threads of the API's process.

A worker step can be long and CPU-bound (redacting and storing a large result, unpacking a
bundle, building a context); in the API's process it held the interpreter while it ran, so
`/healthz` and every long-poll waited for it. In a process of its own it cannot stall the API.
The child relays its metric observations over a pipe (metrics.RelayedMetrics), so the API's
/metrics still shows them; it ends when `gate serve` does (SIGTERM on stop, and on the
parent's death through PR_SET_PDEATHSIG), and is started again if it dies on its own.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from ..metrics import Metrics, relay_into

log = logging.getLogger("gate")

PR_SET_PDEATHSIG = 1
STOP_SECONDS = 60.0  # a worker finishes its case, then hands its jobs back
RESTART_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)
STEADY_SECONDS = 60.0  # a child that ran this long resets the restart back-off


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when ``parent_pid`` (its parent) ends; exit now if it has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # it ended before the prctl took effect
        raise SystemExit(0)


class EmbeddedWorkers:
    """One `gate worker --threads N` child of this process, supervised."""

    def __init__(self, url: str, threads: int, metrics: Metrics) -> None:
        self.url, self.threads, self.metrics = url, threads, metrics
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._supervisor: threading.Thread | None = None
        # Set once a child has started its workers, or ended before it could (`gate worker
        # --ready-fd`): `gate serve` shows a first start's token after it.
        self.ready = threading.Event()
        # The current child's workers that have started (each can claim a gate): /readyz
        # answers 200 from the first. A child of its own generation: a dead child's late
        # lines count for nothing.
        self._generation = 0
        self._up = 0

    def workers_up(self) -> int:
        """How many workers of the running child can claim a gate now."""
        with self._lock:
            proc = self._proc
            up = self._up
        return up if proc is not None and proc.poll() is None else 0

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        with self._lock:
            self._proc = self._spawn()
        self._supervisor = threading.Thread(
            target=self._supervise, name="gate-embedded-workers", daemon=True
        )
        self._supervisor.start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        read_end, write_end = os.pipe()
        ready_read, ready_write = os.pipe()
        argv = [
            sys.executable, "-m", "gate_service.cli", "worker",
            "--threads", str(self.threads),
            "--metrics-fd", str(write_end),
            "--parent-pid", str(os.getpid()),
            "--ready-fd", str(ready_write),
        ]  # fmt: skip
        try:
            proc = subprocess.Popen(
                argv,
                env={**os.environ, "GATE_DATABASE_URL": self.url},
                pass_fds=(write_end, ready_write),
            )
        except BaseException:
            os.close(read_end)
            os.close(ready_read)
            raise
        finally:
            os.close(write_end)
            os.close(ready_write)
        relay_into(self.metrics, read_end)  # ends when the child closes its end
        self._generation += 1  # under self._lock, as every caller of _spawn holds it
        self._up = 0
        threading.Thread(
            target=self._await_ready,
            args=(ready_read, self._generation),
            name="gate-embedded-ready",
            daemon=True,
        ).start()
        log.info("embedded worker process %s started (%s thread(s))", proc.pid, self.threads)
        return proc

    def _await_ready(self, ready_read: int, generation: int) -> None:
        """Count the child's ``started`` lines, one per worker that can claim; ``ready`` once
        all have started, or the child closed its end (it ended)."""
        pending = b""
        try:
            with os.fdopen(ready_read, "rb", buffering=0) as lines:
                while chunk := lines.read(64):
                    pending += chunk
                    started = pending.count(b"\n")
                    pending = pending[pending.rfind(b"\n") + 1 :]
                    with self._lock:
                        if generation != self._generation:
                            return
                        self._up += started
                        up = self._up
                    if up >= self.threads:
                        self.ready.set()
        except OSError:
            pass
        finally:
            self.ready.set()

    def _supervise(self) -> None:
        failures = 0
        while True:
            with self._lock:
                proc = self._proc
            assert proc is not None
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            failures = 0 if time.monotonic() - started > STEADY_SECONDS else failures + 1
            delay = RESTART_DELAYS[min(failures, len(RESTART_DELAYS)) - 1] if failures else 0.0
            log.error(
                "the embedded worker process %s exited with code %s; starting another in %s s",
                proc.pid,
                code,
                delay,
            )
            if self._stopping.wait(delay):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._proc = self._spawn()
                except OSError:
                    log.exception("could not start an embedded worker process; retrying")

    def stop(self) -> None:
        """SIGTERM the child and wait for it to hand its jobs back (then SIGKILL)."""
        self._stopping.set()
        with self._lock:
            proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                log.warning("the embedded worker process %s did not stop; killing it", proc.pid)
                proc.kill()
                proc.wait()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)

"""Invocation processes: forked, under the case's own uid when isolated, reporting over pipes.

Trust: this process (the runner) computes the verdict, and never runs user code. Each
invocation is a forked child that, in a case container, drops to an unprivileged uid (which
clears every capability it had) before any user code is imported. A child reaches the runner
only through three pipes: its stdout, its stderr and a report channel, each read here with a
byte budget. Nothing a child can write to a file is ever read back as a result, and when no
invocation is running every process of the user uid is killed, so nothing outlives its
invocation.

In-process use (tests, `gate record` on a developer machine) runs the same code with no uid
change: isolation needs the runner to start as root in a container with only the SETUID,
SETGID and KILL capabilities (see gate_service/sandbox/docker/cases.py).
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import GatewayChannel

REPORT_FD = 3  # the child's end of its report channel
READ_CHUNK = 64 * 1024
# What one invocation's report may hold. Outputs and traces are compacted for storage later,
# but judged whole, so this bounds the runner's memory, not what the user sees.
MAX_REPORT_BYTES = 32 * 1024 * 1024
# Of each stream only the head becomes log spans; the rest is counted, not kept.
KEPT_STREAM_BYTES = 1024 * 1024
DEFAULT_OUTPUT_LIMIT_BYTES = 8 * 1024 * 1024
SCRATCH_FULL_BELOW_BYTES = 64 * 1024
SWEEP_SECONDS = 5.0
# kill(-1) passes of the sweep's helper. One reaches every process of the uid: it walks the
# task list under its lock, and a fork racing it fails once its parent has the SIGKILL. The
# later passes are for safety, and /proc is read after them. A pass never reports that it
# found nothing: the kernel counts the processes it may not signal (the runner), so
# kill(-1) succeeds while the runner lives. A loop of 1000 "until none is left" ran all
# 1000 passes, about 3.4 ms of every case's CPU.
KILL_ALL_PASSES = 3
# After a child is gone, what its pipes still hold is read up to this much: a detached
# process that kept a write end and never stops writing must not hold the loop.
DRAIN_CHUNKS = 64
# At its deadline an invocation is first asked to end its run (this signal, which its main
# thread turns into the run's end, so that middleware cleanup still runs: issue 39); one that
# has not ended this many seconds later is killed with its whole process group.
STOP_SIGNAL = signal.SIGUSR1
STOP_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class Isolation:
    """How invocations are kept from the runner and from each other."""

    uid: int | None = None  # user code runs under this uid (the runner must be root)
    output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT_BYTES  # stdout + stderr per invocation
    scratch_dir: Path | None = None  # the case's /tmp, reported by name when it fills up
    # The case's environment (project secrets, GATE_CASE_ENV values): added to each
    # invocation's own environment after it drops its uid, never to the runner's.
    env: Mapping[str, str] = field(default_factory=dict)
    # The case's model gateway channel (its token from the handoff): inherited in memory by
    # each invocation, which calls the model, and never in its environment, where every
    # subprocess of user code would get it for nothing.
    gateway: GatewayChannel | None = None
    # The project's api: tools for the SDK loader (case_env.Handoff.api_tools).
    api_tools: Mapping[str, Any] = field(default_factory=dict)
    # The project's judge model for the judged guardrails (judge.py), when it names one.
    guardrail_model: str | None = None


class Channel:
    """The child's end of its report channel: one JSON document per line.

    A stop (STOP_SIGNAL) that arrives while a line is being written waits for the line to
    be whole: ``busy`` says a send is in progress, and ``deferred`` is what the stop's
    handler left to do once it is done (case.py)."""

    busy = False
    deferred: Callable[[], None] | None = None

    def send(self, kind: str, data: Any) -> None:
        line = json.dumps({"kind": kind, "data": data}, default=repr).encode() + b"\n"
        view = memoryview(line)
        self.busy = True
        try:
            while view:
                view = view[os.write(REPORT_FD, view) :]
        finally:
            self.busy = False
        if self.deferred is not None:
            deferred, self.deferred = self.deferred, None
            deferred()


def drop_privileges(uid: int) -> None:
    """Become ``uid`` for good: real, effective and saved ids, no groups, no capabilities."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to non-root: the kernel clears every capability
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise RuntimeError(f"could not drop to uid {uid}")


def make_undumpable() -> None:
    """No ptrace, no /proc/<pid>/fd, mem or environ of this process for anyone else."""
    import ctypes

    pr_set_dumpable = 4
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


@dataclass(eq=False)
class Proc:
    """A forked child while the runner supervises it."""

    pid: int
    started: float
    deadline: float
    # Granted once, when the deadline passes after the child reported "agent": a builder's
    # cleanup has a budget of its own after the agent is done.
    after_agent_seconds: float | None = None
    # Given, the child is sent STOP_SIGNAL at its deadline and killed only this much later.
    stop_grace_seconds: float | None = None
    fds: dict[int, str] = field(default_factory=dict)  # open read ends: fd -> stream
    kept: dict[str, bytearray] = field(default_factory=dict)
    printed: int = 0  # stdout + stderr bytes, kept or not
    report: bytearray = field(default_factory=bytearray)
    report_overflow: bool = False
    output_dropped: bool = False
    timed_out: bool = False
    status: int = 0
    ended_at: float = 0.0

    def messages(self) -> dict[str, Any]:
        """The last report of each kind; a line that is not a report is ignored."""
        found: dict[str, Any] = {}
        for line in bytes(self.report).splitlines():
            try:
                message = json.loads(line)
                found[str(message["kind"])] = message["data"]
            except (ValueError, KeyError, TypeError, RecursionError):
                continue
        return found

    def has_reported(self, kind: str) -> bool:
        return f'{{"kind": "{kind}"'.encode() in self.report

    def stream_text(self, name: str) -> bytes:
        return bytes(self.kept.get(name, b""))

    def exit_description(self) -> str:
        if os.WIFSIGNALED(self.status):
            signum = os.WTERMSIG(self.status)
            return f"was killed by signal {signum}" + (
                " (out of memory?)" if signum == signal.SIGKILL else ""
            )
        return f"exited with code {os.WEXITSTATUS(self.status)}"


class Supervisor:
    """Forks children, reads their pipes without blocking, and enforces their deadlines."""

    def __init__(self, isolation: Isolation) -> None:
        self.isolation = isolation
        self.selector = selectors.DefaultSelector()
        self.active: list[Proc] = []

    def spawn(
        self,
        body: Callable[[Channel], None],
        *,
        timeout_s: float,
        after_agent_seconds: float | None = None,
        stop_grace_seconds: float | None = None,
    ) -> Proc:
        pipes = {name: os.pipe() for name in ("stdout", "stderr", "report")}
        started = time.monotonic()
        # The child's garbage collections must not walk the heap it shares with this process:
        # a full one touches every object, and so copies, page by page, all of that heap
        # before the child's own code goes on, against its timeout_s. In a container's runner
        # that heap is small; under a process that runs cases in-process (pytest) it is not:
        # 1.1 s for 6 million objects, unloaded. Frozen, those objects stay out of the child's
        # collections; unfrozen here at once, they stay in ours. (Two threads spawning at once
        # may undo each other's freeze: that costs a child this saving, nothing else.)
        gc.freeze()
        try:
            pid = os.fork()
        except BaseException:
            gc.unfreeze()
            raise
        if pid == 0:  # pragma: no cover - the child leaves through os._exit
            self._child(body, {name: w for name, (_r, w) in pipes.items()})
        gc.unfreeze()
        proc = Proc(pid, started, started + timeout_s, after_agent_seconds, stop_grace_seconds)
        for name, (r, w) in pipes.items():
            os.close(w)
            os.set_blocking(r, False)
            proc.fds[r] = name
            self.selector.register(r, selectors.EVENT_READ, proc)
        self.active.append(proc)
        return proc

    def _child(self, body: Callable[[Channel], None], ends: dict[str, int]) -> None:
        code = 0
        try:
            # The selector's epoll descriptor came along with the fork: close it through its
            # object, or that object would close the number later, when it may be the report
            # channel (a fork hazard: Python objects own descriptors by number).
            self.selector.close()
            os.setsid()  # its own process group, killed whole at the deadline
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)  # the runner's stdin, where the nonce waits (see case_env.py)
            os.dup2(ends["stdout"], 1)
            os.dup2(ends["stderr"], 2)
            os.dup2(ends["report"], REPORT_FD, inheritable=False)
            # Everything else the runner holds (its own stdout, other invocations' pipes)
            # stays out of reach of user code.
            os.closerange(REPORT_FD + 1, os.sysconf("SC_OPEN_MAX"))
            if self.isolation.uid is not None:
                drop_privileges(self.isolation.uid)
            os.environ.update(self.isolation.env)
            from . import loopback

            loopback.install()  # `localhost` resolves with no network too (see loopback.py)
            # Rebind the Python-level streams too, whatever they were (a test harness, say).
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            # User code runs with Python's collector on, as anywhere else; a case
            # container's runner has it off (__main__.py). What this child inherited is
            # frozen (spawn), so its collections never walk the runner's heap.
            gc.enable()
            body(Channel())
        except BaseException:
            code = 70
            try:  # onto the invocation's stderr, which becomes its log spans
                os.write(2, traceback.format_exc(limit=8).encode(errors="replace"))
            except OSError:
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # user code may have closed or replaced it
                pass
        os._exit(code)

    def wait(self, timeout_s: float = 0.01) -> list[Proc]:
        """Read what the children wrote; return those that ended (exited or killed)."""
        for key, _events in self.selector.select(timeout_s):
            self._read(key.fd, key.data)
        ended: list[Proc] = []
        now = time.monotonic()
        for proc in list(self.active):
            done, status = os.waitpid(proc.pid, os.WNOHANG)
            if not done and now >= proc.deadline:
                if proc.after_agent_seconds is not None and proc.has_reported("agent"):
                    proc.deadline = now + proc.after_agent_seconds
                    proc.after_agent_seconds = None
                    continue
                if proc.stop_grace_seconds is not None and not proc.has_reported("agent"):
                    # Asked to end its run first; killed if it is still there after the grace.
                    proc.timed_out = True
                    proc.deadline = now + proc.stop_grace_seconds
                    proc.stop_grace_seconds = None
                    try:
                        os.kill(proc.pid, STOP_SIGNAL)
                    except ProcessLookupError:
                        pass
                    continue
                proc.timed_out = True
                kill_group(proc.pid)
                _, status = os.waitpid(proc.pid, 0)
                done = proc.pid
            if done:
                proc.status = status
                proc.ended_at = time.monotonic()
                kill_group(proc.pid)  # user code may have left processes behind
                self._close(proc)
                self.active.remove(proc)
                ended.append(proc)
        return ended

    def _read(self, fd: int, proc: Proc) -> bool:
        """Read one chunk; False at end of file or when nothing is there."""
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return False
        name = proc.fds[fd]
        if not chunk:
            self.selector.unregister(fd)
            os.close(fd)
            del proc.fds[fd]
            return False
        if name == "report":
            if len(proc.report) + len(chunk) > MAX_REPORT_BYTES:
                proc.report_overflow = True
            else:
                proc.report += chunk
            return True
        proc.printed += len(chunk)
        if proc.printed > self.isolation.output_limit_bytes:
            proc.output_dropped = True  # read on and drop, so the child never blocks
            return True
        kept = proc.kept.setdefault(name, bytearray())
        kept += chunk[: max(0, KEPT_STREAM_BYTES - len(kept))]
        return True

    def _close(self, proc: Proc) -> None:
        """Take what is still in the pipes (the child is gone), then close them."""
        for fd in list(proc.fds):
            for _ in range(DRAIN_CHUNKS):
                if fd not in proc.fds or not self._read(fd, proc):
                    break
            if fd in proc.fds:
                self.selector.unregister(fd)
                os.close(fd)
                del proc.fds[fd]

    def limit_failures(self, proc: Proc) -> list[str]:
        """Limits the invocation ran into, said so that a person can act on them."""
        failures = []
        if proc.output_dropped:
            failures.append(
                f"the invocation printed more than {self.isolation.output_limit_bytes} bytes "
                "(stdout and stderr); the rest was dropped"
            )
        scratch = self.isolation.scratch_dir
        if scratch is not None:
            try:
                st = os.statvfs(scratch)
            except OSError:
                return failures
            if st.f_bavail * st.f_frsize < SCRATCH_FULL_BELOW_BYTES:
                size_mb = st.f_blocks * st.f_frsize // (1024 * 1024)
                failures.append(f"the case's scratch space ({scratch}, {size_mb} MB) is full")
        return failures

    def close(self) -> None:
        """Release the selector (its epoll descriptor) once every child has ended."""
        self.selector.close()

    def sweep(self) -> bool:
        """Kill every process of the user uid; False if some survived.

        Call only when no invocation is running. First a helper under that uid sends
        SIGKILL with kill(-1), which the kernel delivers to all of the uid's processes at
        once, so a chain of forks cannot slip past it; then (and instead, when the pids limit
        leaves no room for the helper) every process of the uid found in /proc is killed
        until none is left and init has reaped them.
        """
        uid = self.isolation.uid
        if uid is None or self.active:
            return True
        _kill_all_of(uid)
        give_up = time.monotonic() + SWEEP_SECONDS
        while True:
            pids = processes_of(uid)
            if not pids:
                return True
            if time.monotonic() > give_up:
                return False
            for pid in pids:  # SIGKILL needs no cooperation; init reaps what we kill
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)


def _kill_all_of(uid: int) -> None:
    """kill(-1, SIGKILL) from a helper that is ``uid``: all of the uid's processes at once."""
    try:
        pid = os.fork()
    except OSError:
        return  # no room for a helper (a fork bomb): the /proc pass does it alone
    if pid == 0:  # pragma: no cover - the child leaves through os._exit
        code = 0
        try:
            # The runner's stdin still holds the nonce: gone before this becomes ``uid``.
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            drop_privileges(uid)
            for _ in range(KILL_ALL_PASSES):
                os.kill(-1, signal.SIGKILL)  # everything of the uid but this helper
        except ProcessLookupError:
            pass  # nothing else in the container (the runner counts, so never here)
        except BaseException:
            code = 70
        os._exit(code)
    os.waitpid(pid, 0)


def processes_of(uid: int) -> list[int]:
    """Every process whose real, effective or saved uid is ``uid`` (zombies included)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Uid:"):
                        if str(uid).encode() in line.split()[1:4]:
                            found.append(int(entry))
                        break
        except OSError:
            continue  # it ended while we looked
    return found


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass

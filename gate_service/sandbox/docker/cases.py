"""Case containers: one hardened container per case, its stdin handoff through an attach made
before it starts, the wait for its end or its wall deadline, and its removal when the job
halts."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from docker.types import LogConfig, Mount, Ulimit

from gate_runner import gateway_wire
from gate_runner.contract import END_MARKER

from ..port import LABEL, Halted, ModelChannel, RunLimits, RunResult, SandboxError
from .engine import HALT_POLL_SECONDS, MIB, DockerEngine, docker_errors, task_ulimits
from .wire import EngineCallError, EngineNotFound, EngineTimeout, Wire, demultiplex, path_of

log = logging.getLogger(__name__)

RESULT_END = END_MARKER.encode()  # the last line of a runner's stdout once it has judged

# A case container's exit codes that only a signal from outside it can cause: the runner runs
# under an init as root, which nothing in the case can signal, and an out-of-memory kill is
# reported as OOMKilled. The engine's own stop (SIGTERM, then SIGKILL) when it shuts down or
# restores its containers after a crash ends a case this way.
STOPPED_FROM_OUTSIDE = frozenset({128 + signal.SIGKILL, 128 + signal.SIGTERM})


# How long a run waits for a removal that another thread started (the heartbeat's reap, the
# halt watch) to finish, before it leaves the rest to the orphan reaper.
REMOVAL_WAIT_SECONDS = 60


def remove_until_gone(engine: Wire, container_id: str) -> None:
    """Remove a case container, and return only once the engine no longer has it.

    A removal another thread started first (the heartbeat's reap on a cancel, the halt watch)
    answers 409 "removal in progress": that one is waited for, so a gate's verdict, written
    after its cases' runs return, never lands while a container of it still exists.
    """
    path = path_of("/containers/{0}", container_id)
    try:
        engine.call("DELETE", path, params={"force": 1})
        return
    except EngineNotFound:
        return
    except EngineCallError as exc:
        if exc.status != 409:
            log.warning("could not remove container %s: %s", container_id, exc)
            return
    try:
        engine.call(
            "POST",
            path + "/wait",
            params={"condition": "removed"},
            timeout=REMOVAL_WAIT_SECONDS,
        )
    except EngineNotFound:
        pass  # gone before the wait began
    except EngineCallError as exc:
        log.warning("container %s: waiting for its removal failed: %s", container_id, exc)


def case_container(
    argv: Sequence[str],
    *,
    limits: RunLimits,
    labels: Mapping[str, str],
    model_channel: ModelChannel | None,
    runtime: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A case container's host config and create parameters, as `CaseContainers.run` makes
    them (and tests/bench/bench_gate.py its import-only floor, so that floor pays the same
    isolation a case does).

    The port's policies, the Docker way: ``limits.network`` is the container's network mode
    (``none``, or the operator's named network), and the model channel's folder is
    bind-mounted read-only at gateway_wire.SOCKET_DIR, so its socket is at SOCKET_PATH.
    """
    if model_channel is not None and model_channel.socket.name != gateway_wire.SOCKET_NAME:
        raise ValueError(
            f"the Docker backend mounts a model channel's folder at {gateway_wire.SOCKET_DIR}, "
            f"so its socket must be named {gateway_wire.SOCKET_NAME}: {model_channel.socket}"
        )
    # The host side of the container (HostConfig): its limits and what it may do.
    host: dict[str, Any] = {
        # The runner starts as root with only what it needs to run each invocation under
        # INVOCATION_UID (which then holds no capability) and to kill what it leaves.
        "cap_drop": ["ALL"],
        "cap_add": ["SETUID", "SETGID", "KILL"],
        "security_opt": ["no-new-privileges"],
        "init": True,  # reaps the orphans that invocations leave and the runner kills
        "ulimits": [
            Ulimit(name="nofile", soft=1024, hard=1024),
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="fsize", soft=limits.tmpfs_mb * MIB, hard=limits.tmpfs_mb * MIB),
            *task_ulimits(limits.guest_tasks),
        ],
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={limits.tmpfs_mb}m,mode=1777"},
        "pids_limit": limits.pids,
        "mem_limit": f"{limits.memory_mb}m",
        "memswap_limit": f"{limits.memory_mb}m",
        "nano_cpus": int(limits.cpus * 1e9),
        # No network, or the operator's named one (the port refuses "host" and "container:").
        "network_mode": limits.network.name or "none",
        # The case's model gateway socket, and nothing else of the host: read-only, so
        # the case can connect to the socket but not replace it or leave files beside it.
        "mounts": [
            Mount(
                target=gateway_wire.SOCKET_DIR,
                source=str(model_channel.folder),
                type="bind",
                read_only=True,
            )
        ]
        if model_channel is not None
        else [],
        # Rotation keeps the tail, which is where the runner's result is.
        "log_config": LogConfig(
            type="json-file",
            config={"max-size": str(limits.output_limit_bytes), "max-file": "1"},
        ),
    }
    if runtime is not None:
        host["runtime"] = runtime  # GATE_CASE_RUNTIME (runsc: under gVisor); else the engine's
    create: dict[str, Any] = {
        "command": list(argv),
        "user": "0:0",
        # With no network the engine need not join one: NetworkDisabled gives the
        # container a fresh namespace with only loopback, as "none" does, but skips
        # libnetwork's sandbox and the prestart hook that re-executes dockerd once per
        # container, which was half the CPU of a case container's start (Docker 20.10).
        "network_disabled": limits.network.isolated,
        "labels": {LABEL: "case", **labels},
        # No environment of ours: the image's alone reaches the runner's process. What a
        # case needs (its environment, the nonce) goes to the runner's stdin, read once.
        # With stdin_open the SDK also sets StdinOnce (it creates attached containers):
        # the engine closes the container's stdin when our attach ends, an end of file.
        "stdin_open": True,
        "working_dir": "/bundle",
    }
    return host, create


class CaseContainers(DockerEngine):
    """Creates case containers (CaseRunner.create), and runs one to its end or its wall
    deadline (CaseRunner.run)."""

    def create(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Mapping[str, str],
        halt: threading.Event | None = None,
        model_channel: ModelChannel | None = None,
    ) -> DockerCaseContainer:
        """A case container, created and not started (see CaseRunner.create).

        ``halt`` set before it is created: none is, and Halted is raised.
        """
        if halt is not None and halt.is_set():
            raise Halted("the job was halted; no case container was created")
        host, create = case_container(
            argv,
            limits=limits,
            labels=labels,
            model_channel=model_channel,
            runtime=self.settings.case_runtime,
        )
        started = time.monotonic()
        with docker_errors(f"creating a case container from {image}"):
            api = self.client.api
            # docker-py makes the body (its host config and container config, as its own
            # create would), the wire sends it. Not docker-py's create_container: besides its
            # cost, it would add proxy variables from the host's ~/.docker/config.json to the
            # container's environment, where nothing of ours belongs.
            config = api.create_container_config(
                image, host_config=api.create_host_config(**host), **create
            )
            body = {key: value for key, value in config.items() if value is not None}
            created = self.wire.call("POST", "/containers/create", body=body)
        create_ms = int((time.monotonic() - started) * 1000)
        return DockerCaseContainer(self.wire, str(created["Id"]), limits, create_ms=create_ms)

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Mapping[str, str],
        stdin: bytes = b"",
        halt: threading.Event | None = None,
        model_channel: ModelChannel | None = None,
    ) -> RunResult:
        """One case container, created, run to its end or its wall deadline, and removed
        (see CaseRunner.run).

        ``halt`` (the job's: set when it is cancelled or its lease is lost, before the
        heartbeat removes the gate's containers) is read before the container is created and
        again once it exists, before it starts: a container created after the removal pass
        is removed here instead of running to completion. Set while the container runs, it
        is removed within HALT_POLL_SECONDS. Each raises Halted.
        """
        container = self.create(
            image, argv, limits=limits, labels=labels, halt=halt, model_channel=model_channel
        )
        try:
            return container.run(stdin, wall_seconds=limits.wall_seconds, halt=halt)
        finally:
            container.remove()


class DockerCaseContainer:
    """One created case container (CaseContainer): run once, then removed."""

    def __init__(self, engine: Wire, container_id: str, limits: RunLimits, *, create_ms: int):
        self.engine = engine
        self.id = container_id
        self.path = path_of("/containers/{0}", container_id)
        self.limits = limits
        self.create_ms = create_ms
        self._started = False

    def run(
        self, stdin: bytes, *, wall_seconds: float, halt: threading.Event | None = None
    ) -> RunResult:
        """Start it with ``stdin`` handed to the runner, and wait for its end or
        ``wall_seconds``; its output is read, and removing it is ``remove``'s."""
        engine, path, limits = self.engine, self.path, self.limits
        if halt is not None and halt.is_set():
            raise Halted("the job was halted; the case container was not started")
        if self._started:  # the engine would start it again, from its used file system
            raise SandboxError("a case container runs once; this one has run")
        self._started = True
        with docker_errors("starting a case container"):
            # Attached before the start, so nothing the runner reads can be missed.
            handoff = engine.hijack(path + "/attach", params={"stdin": 1, "stream": 1})
            try:
                started = time.monotonic()
                engine.call("POST", path + "/start")
                # The engine's time to make the container and start it, less any wait for a
                # case slot between the two.
                start_ms = self.create_ms + int((time.monotonic() - started) * 1000)
                _send_and_close(handoff, stdin, wall_seconds)
            finally:
                handoff.close()
        timed_out, exit_code = _wait(engine, path, wall_seconds, halt)
        duration_ms = int((time.monotonic() - started) * 1000) + self.create_ms
        with docker_errors("reading a case container's output"):
            state = (engine.call("GET", path + "/json") or {}).get("State") or {}
            oom = bool(state.get("OOMKilled"))
            stdout = _logs(engine, path, stdout=1)
            # Only a runner that broke has its stderr read (worker/outcome.py): one that
            # exited 0 after its result block is not asked, an engine call less per case.
            # Its tail alone is looked at, not a stripped copy of all it printed.
            tail = stdout[-(len(RESULT_END) + 64) :].rstrip()
            stderr = (
                b""
                if exit_code == 0 and tail.endswith(RESULT_END)
                else _logs(engine, path, stderr=1, tail=200)
            )
        if not timed_out and not oom and exit_code in STOPPED_FROM_OUTSIDE:
            raise SandboxError(
                f"the case container was stopped from outside (exit code {exit_code}): the "
                "Docker engine restarted or stopped, or someone stopped the container; "
                "the case was not judged"
            )
        truncated = len(stdout) > limits.output_limit_bytes
        return RunResult(
            exit_code=exit_code,
            stdout=stdout[-limits.output_limit_bytes :],
            stderr=stderr[-64_000:],
            duration_ms=duration_ms,
            timed_out=timed_out,
            oom_killed=oom,
            output_truncated=truncated,
            start_ms=start_ms,
        )

    def remove(self) -> None:
        """Remove it, run or not, returning once the engine no longer has it."""
        remove_until_gone(self.engine, self.id)


def _logs(engine: Wire, path: str, *, stdout: int = 0, stderr: int = 0, tail: int = 0) -> bytes:
    """A stopped container's output (all of it, or its last ``tail`` lines), as docker-py's
    ``logs()`` returns it, less the inspect it makes first to ask whether the container has
    a TTY (ours never do)."""
    params = {
        "stdout": stdout,
        "stderr": stderr,
        "timestamps": 0,
        "follow": 0,
        "tail": tail or "all",
    }
    return demultiplex(engine.read(path + "/logs", params=params))


def _wait(
    engine: Wire, path: str, wall_seconds: float, halt: threading.Event | None = None
) -> tuple[bool, int | None]:
    """(timed_out, exit code): the container's end, or its kill at the wall deadline.

    Only a read that ran the whole deadline is a timeout (the case's fault, judged
    failed). The connection breaking before that (the engine restarted, crashed or
    stopped) says nothing about the case: it is a SandboxError, an infrastructure fault
    that the job is retried for, never a case that "ran past its hard deadline".
    ``halt`` set meanwhile removes the container and raises Halted.
    """
    started = time.monotonic()
    finished = threading.Event()

    def watch_halt() -> None:
        assert halt is not None
        while not finished.wait(HALT_POLL_SECONDS):
            if halt.is_set():
                try:
                    engine.call("DELETE", path, params={"force": 1})
                except EngineCallError as exc:
                    log.debug("removing a halted case container: %s", exc)
                return

    if halt is not None:
        threading.Thread(target=watch_halt, name="gate-case-halt", daemon=True).start()
    try:
        status = engine.call("POST", path + "/wait", timeout=wall_seconds) or {}
        if halt is not None and halt.is_set():
            raise Halted("the job was halted; its case container was removed")
        return False, int(status.get("StatusCode", -1))
    except EngineCallError as exc:
        if not isinstance(exc, EngineTimeout):
            if halt is not None and halt.is_set():
                raise Halted("the job was halted; its case container was removed") from None
            raise SandboxError(
                f"lost the Docker engine while a case container ran ({exc}); "
                "the case was not judged"
            ) from None
        if time.monotonic() - started < wall_seconds - 1:
            raise SandboxError(
                f"waiting for a case container failed early: {exc}; the case was not judged"
            ) from None
    finally:
        finished.set()
    with docker_errors("stopping a timed-out case container"):
        engine.call("POST", path + "/kill")
    return True, None


def _send_and_close(attached: socket.socket, data: bytes, timeout_s: float) -> None:
    """Write ``data`` to a container's stdin through its attach socket, then end the stream.

    The attach is a hijacked HTTP connection; closing its write half tells the engine the
    input has ended, and with ``stdin_once`` it closes the container's stdin. The runner
    reads the environment at once, and the rest (the nonce) waits in the engine's pipe.
    """
    raw: socket.socket = getattr(attached, "_sock", attached)
    raw.settimeout(timeout_s)
    try:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError as exc:
        raise SandboxError(f"handing the case its input failed: {exc}") from None

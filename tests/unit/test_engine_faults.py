"""How DockerSandbox.run classifies the end of a case container (issue #12 item 5).

A container that ran the whole wall deadline is the case's fault (timed_out, judged failed);
an engine that went away or stopped the container is infrastructure (SandboxError: the job is
retried up to GATE_JOB_MAX_ATTEMPTS, then `error`). The errors raised here are the engine
wire's (sandbox/docker/wire.py), as tests/unit/test_engine_wire.py shows a failing engine
produces them; tests/e2e/test_engine_restart.py does the same against a real, private dockerd.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import docker
import pytest

from gate_service.config import Settings
from gate_service.sandbox import RunLimits, RunResult, SandboxError
from gate_service.sandbox.docker import DockerSandbox
from gate_service.sandbox.docker.wire import EngineCallError, EngineNotFound, EngineTimeout
from gate_service.sandbox.port import LABEL

LIMITS = RunLimits(
    memory_mb=64, cpus=1, pids=32, wall_seconds=2, tmpfs_mb=8, output_limit_bytes=10_000
)


CID = "c0ffee"


class StubWire:
    """A case container's engine calls (wire.Wire), answered as scripted: ``wait`` is the
    exit code the wait answers, an error it raises, or a function of its timeout."""

    def __init__(self, wait: Any, state: dict[str, Any] | None = None) -> None:
        self._wait = wait
        self.state: dict[str, Any] = state or {}
        self.stdout = b""
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.remove_error: EngineCallError | None = None
        self.gone = threading.Event()  # set once the container is removed

    def _did(self, method: str) -> bool:
        return any(call[0] == method for call in self.calls)

    @property
    def killed(self) -> bool:
        return any(path.endswith("/kill") for _, path, _ in self.calls)

    @property
    def removed(self) -> bool:
        return self._did("DELETE")

    @property
    def logs_read(self) -> list[dict[str, Any]]:
        return [params for _, path, params in self.calls if path.endswith("/logs")]

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        body: Any = None,
        timeout: float | None = None,
    ) -> Any:
        self.calls.append((method, path, dict(params or {})))
        if path == "/containers/create":
            return {"Id": CID}
        assert path.startswith(f"/containers/{CID}"), path
        if method == "DELETE":
            if self.remove_error is not None:
                raise self.remove_error
            self.gone.set()
            return None
        if path.endswith("/wait") and (params or {}).get("condition") == "removed":
            assert timeout is not None and self.gone.wait(timeout)
            return {"StatusCode": 0}
        if path.endswith("/wait"):
            if isinstance(self._wait, BaseException):
                raise self._wait
            if callable(self._wait):
                return dict(self._wait(timeout))
            return {"StatusCode": self._wait}
        if path.endswith("/json"):
            return {"Id": CID, "State": self.state}
        return None  # start, kill

    def read(self, path: str, *, params: Any = None) -> bytes:
        self.calls.append(("GET", path, dict(params or {})))
        assert path == f"/containers/{CID}/logs"
        said = self.stdout if params["stdout"] else b"the runner's stderr"
        return b"\x01\x00\x00\x00" + len(said).to_bytes(4, "big") + said if said else b""

    def hijack(self, path: str, *, params: Any = None) -> socket.socket:
        """The container's stdin, as the engine's hijacked attach connection is a socket."""
        self.calls.append(("POST", path, dict(params or {})))
        ours, self.stdin_peer = socket.socketpair()
        return ours

    def close(self) -> None:
        pass


class StubApi:
    """What the sandbox makes a case container's create body with (docker-py's, for real)."""

    def __init__(self) -> None:
        self.real = docker.APIClient(base_url="unix:///nowhere.sock", version="1.41")

    def create_host_config(self, **kwargs: Any) -> Any:
        return self.real.create_host_config(**kwargs)

    def create_container_config(self, *args: Any, **kwargs: Any) -> Any:
        return self.real.create_container_config(*args, **kwargs)


class StubClient:
    def __init__(self) -> None:
        self.api = StubApi()

    def ping(self) -> bool:
        return True


def run(wire: StubWire) -> RunResult:
    sandbox = DockerSandbox(Settings(), client=StubClient())  # type: ignore[arg-type]
    sandbox.wire = wire
    return sandbox.run("img", ["true"], limits=LIMITS, labels={})


def timeout_error() -> EngineTimeout:
    return EngineTimeout(f"POST unix:///run/docker.sock/v1.41/containers/{CID}/wait: timed out")


LOST_ENGINE = [
    EngineCallError("the connection to the engine failed (ConnectionResetError: reset by peer)"),
    EngineCallError("the connection to the engine failed (IncompleteRead(0 bytes read))"),
    EngineCallError("500 Server Error: daemon is shutting down", status=500),
    EngineNotFound(f"404 Client Error: No such container: {CID}", status=404),
]


@pytest.mark.parametrize("error", LOST_ENGINE, ids=["reset", "cut", "500", "404"])
def test_losing_the_engine_mid_case_is_a_sandbox_error_not_a_timeout(error: Exception) -> None:
    wire = StubWire(error)
    with pytest.raises(SandboxError, match="the case was not judged"):
        run(wire)
    assert not wire.killed
    assert wire.removed  # tried, at least; the reaper removes it otherwise


@pytest.mark.slow
def test_only_a_wait_of_the_whole_deadline_is_a_timeout() -> None:
    def slow(timeout: float) -> dict[str, Any]:
        time.sleep(timeout)
        raise timeout_error()

    wire = StubWire(slow)
    result = run(wire)
    assert result.timed_out and result.exit_code is None
    assert wire.killed and wire.removed


def test_an_early_read_timeout_is_not_the_case_running_long() -> None:
    wire = StubWire(timeout_error())
    with pytest.raises(SandboxError, match="failed early"):
        run(wire)
    assert not wire.killed


def test_the_wait_reads_for_the_wall_deadline_and_the_runner_gets_its_stdin() -> None:
    waited: list[float | None] = []
    wire = StubWire(lambda timeout: waited.append(timeout) or {"StatusCode": 0})
    run(wire)
    assert waited == [LIMITS.wall_seconds]
    # attached before the start, and the stdin's end handed over with it
    order = [path.rsplit("/", 1)[-1] for _, path, _ in wire.calls]
    assert order[:4] == ["create", "attach", "start", "wait"], order
    assert wire.stdin_peer.recv(10) == b""


@pytest.mark.parametrize("code", [137, 143])
def test_a_container_stopped_from_outside_is_a_sandbox_error(code: int) -> None:
    wire = StubWire(code, {"OOMKilled": False})
    with pytest.raises(SandboxError, match="stopped from outside"):
        run(wire)
    assert wire.removed


def test_an_out_of_memory_kill_stays_the_case_s_outcome() -> None:
    result = run(StubWire(137, {"OOMKilled": True}))
    assert result.oom_killed and result.exit_code == 137 and not result.timed_out


@pytest.mark.parametrize("code", [0, 1, 70])
def test_the_runner_s_own_exit_codes_are_results(code: int) -> None:
    result = run(StubWire(code, {"OOMKilled": False}))
    assert result.exit_code == code and not result.timed_out


class ReapWire:
    """The engine's side of a reap: lists the containers it holds (id, labels) and answers
    each removal with the error given for that container, if any."""

    def __init__(self, containers: dict[str, tuple[dict[str, str], EngineCallError | None]]):
        self.containers = containers
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def call(self, method: str, path: str, *, params: Any = None, **_: Any) -> Any:
        self.calls.append((method, path, dict(params or {})))
        if method == "GET" and path == "/containers/json":
            return [{"Id": cid, "Labels": labels} for cid, (labels, _) in self.containers.items()]
        assert method == "DELETE" and params == {"force": 1}, (method, path, params)
        fails_with = self.containers[path.removeprefix("/containers/")][1]
        if fails_with is not None:
            raise fails_with
        return None

    def close(self) -> None:
        pass


def reaper(wire: ReapWire) -> DockerSandbox:
    sandbox = DockerSandbox(Settings(), client=StubClient())  # type: ignore[arg-type]
    sandbox.wire = wire  # type: ignore[assignment]
    return sandbox


def test_a_reap_racing_another_removal_is_not_an_engine_failure() -> None:
    # A container whose removal is already in progress (409) or done (404) is not ours to
    # count, and not an error: two reapers (a heartbeat and the orphan pass) may race.
    wire = ReapWire(
        {
            "a": ({}, EngineCallError("removal of container a is already in progress", status=409)),
            "b": ({}, EngineNotFound("No such container: b", status=404)),
            "c": ({}, None),
        }
    )
    assert reaper(wire).reap({}) == 1


def test_a_reap_still_reports_a_real_engine_error() -> None:
    wire = ReapWire({"a": ({}, EngineCallError("driver failed", status=500))})
    with pytest.raises(SandboxError):
        reaper(wire).reap({})


def test_a_reap_reads_labels_from_the_listing_and_inspects_no_container() -> None:
    # The orphan pass runs every REAP_EVERY_SECONDS while gates run: docker-py's listing
    # inspected each container it listed, an engine call per case container each time.
    ours = {"gate.case_id": "1", "gate.gate_id": "g", "gate.owner": "w"}
    wire = ReapWire({"a": (ours, None), "b": ({**ours, "gate.case_id": "2"}, None)})
    seen: list[dict[str, str]] = []

    def keep(labels: Any) -> bool:
        seen.append(dict(labels))
        return labels["gate.case_id"] == "1"

    assert reaper(wire).reap({"gate.gate_id": "g"}, keep=keep) == 1
    assert seen == [ours, {**ours, "gate.case_id": "2"}]
    (listing,) = [c for c in wire.calls if c[0] == "GET"]
    filters = json.loads(str(listing[2]["filters"]))
    assert listing[2]["all"] == 1 and filters == {"label": [LABEL, "gate.gate_id=g"]}
    assert [c[:2] for c in wire.calls[1:]] == [("DELETE", "/containers/b")]


def test_a_run_returns_only_once_its_container_is_gone() -> None:
    # Else a gate's verdict (written once its cases' runs return) could land while one of
    # its containers still exists, as a cancel's did. Another thread's removal (the
    # heartbeat's reap on a cancel) answers 409; the engine drops it a moment later.
    wire = StubWire(0)
    wire.remove_error = EngineCallError("removal of container c0ffee is in progress", status=409)
    threading.Timer(0.2, wire.gone.set).start()
    run(wire)
    waits = [params for _, path, params in wire.calls if path.endswith("/wait")]
    assert waits[-1] == {"condition": "removed"} and wire.gone.is_set()


def test_a_container_already_gone_is_not_waited_for() -> None:
    wire = StubWire(0)
    wire.remove_error = EngineNotFound("no such container", status=404)
    assert run(wire).exit_code == 0
    waits = [params for _, path, params in wire.calls if path.endswith("/wait")]
    assert waits == [{}], "a container already gone was waited for"


def test_the_stderr_of_a_runner_that_judged_is_not_read() -> None:
    # One engine call less per case: only a runner that broke has its stderr looked at.
    judged = StubWire(0)
    judged.stdout = b"===GATE-RUNNER-RESULT-BEGIN===\n{}\n===GATE-RUNNER-RESULT-END===\n"
    result = run(judged)
    assert result.stdout == judged.stdout and result.stderr == b""
    assert [call["stdout"] for call in judged.logs_read] == [1]


@pytest.mark.parametrize(
    ("code", "stdout"),
    [
        (1, b"===GATE-RUNNER-RESULT-BEGIN===\n{}\n===GATE-RUNNER-RESULT-END===\n"),
        (0, b"===GATE-RUNNER-RESULT-BEGIN===\n{}\n"),
        (0, b""),
    ],
    ids=["failed-exit", "no-end-marker", "nothing"],
)
def test_the_stderr_of_a_runner_that_broke_is_read(code: int, stdout: bytes) -> None:
    broke = StubWire(code)
    broke.stdout = stdout
    result = run(broke)
    assert result.stderr == b"the runner's stderr"
    assert [(c["stdout"], c["stderr"], c["tail"]) for c in broke.logs_read] == [
        (1, 0, "all"),
        (0, 1, 200),
    ]


class SocketApi:
    """An engine client's low-level half as docker-py makes it for ``base_url``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.trust_env = True


class SocketClient:
    def __init__(self, base_url: str) -> None:
        self.api = SocketApi(base_url)

    def ping(self) -> bool:
        return True


def test_a_local_engine_socket_is_called_without_looking_for_proxies_or_netrc() -> None:
    # docker-py names every local transport (unix socket, named pipe, ssh) http+docker://.
    local = SocketClient("http+docker://localhost")
    DockerSandbox(Settings(), client=local)  # type: ignore[arg-type]
    assert local.api.trust_env is False
    # A TCP engine may sit behind a proxy the environment names: requests still reads it.
    remote = SocketClient("https://engine.internal:2376")
    DockerSandbox(Settings(), client=remote)  # type: ignore[arg-type]
    assert remote.api.trust_env is True

"""How DockerSandbox.run classifies the end of a case container (issue #12 item 5).

A container that ran the whole wall deadline is the case's fault (timed_out, judged failed);
an engine that went away or stopped the container is infrastructure (SandboxError: the job is
retried up to GATE_JOB_MAX_ATTEMPTS, then `error`). The errors raised here are the docker SDK's
and requests' own classes, as a restarting engine produces them (see
tests/e2e/test_engine_restart.py for the same against a real, private dockerd).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import docker.errors
import pytest
import requests
import requests.exceptions
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from gate_service.config import Settings
from gate_service.sandbox import RunLimits, RunResult, SandboxError
from gate_service.sandbox.docker import DockerSandbox

LIMITS = RunLimits(
    memory_mb=64, cpus=1, pids=32, wall_seconds=2, tmpfs_mb=8, output_limit_bytes=10_000
)


def api_error(status: int, message: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError(message, response=response, explanation=message)


class StubContainer:
    def __init__(self, wait: Any, state: dict[str, Any] | None = None) -> None:
        self._wait = wait
        self.id = "c0ffee"
        self.attrs: dict[str, Any] = {"State": state or {}}
        self.killed = self.removed = self.started = False

    def start(self) -> None:
        self.started = True

    def attach_socket(self, params: dict[str, Any]) -> socket.socket:
        """The container's stdin, as the engine's hijacked attach connection is a socket."""
        ours, self.stdin_peer = socket.socketpair()
        return ours

    def wait(self, timeout: float) -> dict[str, Any]:
        if isinstance(self._wait, BaseException):
            raise self._wait
        if callable(self._wait):
            return dict(self._wait(timeout))
        return {"StatusCode": self._wait}

    def kill(self) -> None:
        self.killed = True

    def reload(self) -> None:
        pass

    stdout = b""
    logs_read: list[dict[str, Any]]

    def logs(self, **kwargs: Any) -> bytes:
        self.__dict__.setdefault("logs_read", []).append(kwargs)
        return self.stdout if kwargs.get("stdout") else b"the runner's stderr"

    def remove(self, force: bool = False) -> None:
        self.removed = True


class StubContainers:
    def __init__(self, container: StubContainer) -> None:
        self.container = container
        self.created = 0

    def create(self, image: str, **_: Any) -> StubContainer:
        self.created += 1
        return self.container

    def prepare_model(self, attrs: dict[str, Any]) -> StubContainer:
        assert attrs["Id"] == self.container.id
        return self.container


class StubApi:
    """The low-level calls the sandbox creates a case container with."""

    def __init__(self, client: StubClient) -> None:
        self.client = client

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    def create_container(self, image: str, **kwargs: Any) -> dict[str, Any]:
        return {"Id": self.client.containers.create(image, **kwargs).id}

    # The log read (cases.read_logs): docker-py's request and demultiplexing, no TTY inspect.
    def _url(self, path: str, *args: str) -> str:
        return path.format(*args)

    def _get(self, url: str, params: dict[str, Any], stream: bool) -> dict[str, Any]:
        assert url == "/containers/c0ffee/logs" and not stream
        return params

    def _get_result_tty(self, stream: bool, params: dict[str, Any], is_tty: bool) -> bytes:
        container = self.client.containers.container
        return container.logs(
            stdout=bool(params["stdout"]), stderr=bool(params["stderr"]), tail=params["tail"]
        )


class StubClient:
    def __init__(self, container: StubContainer) -> None:
        self.containers = StubContainers(container)
        self.api = StubApi(self)

    def ping(self) -> bool:
        return True


def run(container: StubContainer, halt: threading.Event | None = None) -> RunResult:
    sandbox = DockerSandbox(Settings(), client=StubClient(container))  # type: ignore[arg-type]
    return sandbox.run("img", ["true"], limits=LIMITS, labels={})


LOST_ENGINE = [
    requests.exceptions.ConnectionError(
        ProtocolError("Connection aborted.", ConnectionResetError(104, "reset by peer"))
    ),
    requests.exceptions.ChunkedEncodingError(ProtocolError("Response ended prematurely")),
    api_error(500, "Internal Server Error: daemon is shutting down"),
    docker.errors.NotFound("No such container: c0ffee"),
]


@pytest.mark.parametrize("error", LOST_ENGINE, ids=lambda e: type(e).__name__)
def test_losing_the_engine_mid_case_is_a_sandbox_error_not_a_timeout(error: Exception) -> None:
    container = StubContainer(error)
    with pytest.raises(SandboxError, match="the case was not judged"):
        run(container)
    assert not container.killed
    assert container.removed  # tried, at least; the reaper removes it otherwise


def test_only_a_wait_of_the_whole_deadline_is_a_timeout() -> None:
    def slow(timeout: float) -> dict[str, Any]:
        time.sleep(timeout)
        raise requests.exceptions.ReadTimeout("read timed out")

    container = StubContainer(slow)
    result = run(container)
    assert result.timed_out and result.exit_code is None
    assert container.killed and container.removed


def body_read_timeout() -> requests.exceptions.ConnectionError:
    """What a real engine's wait raises at its timeout: the engine sent its headers at once,
    and requests wraps urllib3's timeout reading the body (tests/contract checks it for real)."""
    return requests.exceptions.ConnectionError(
        ReadTimeoutError(None, "/containers/c0ffee/wait", "Read timed out.")  # type: ignore[arg-type]
    )


def test_a_body_read_timeout_of_the_whole_deadline_is_a_timeout() -> None:
    def slow(timeout: float) -> dict[str, Any]:
        time.sleep(timeout)
        raise body_read_timeout()

    container = StubContainer(slow)
    result = run(container)
    assert result.timed_out and result.exit_code is None
    assert container.killed and container.removed


def test_an_early_body_read_timeout_is_not_the_case_running_long() -> None:
    container = StubContainer(body_read_timeout())
    with pytest.raises(SandboxError, match="failed early"):
        run(container)
    assert not container.killed


def test_an_early_read_timeout_is_not_the_case_running_long() -> None:
    container = StubContainer(requests.exceptions.ReadTimeout("read timed out"))
    with pytest.raises(SandboxError):
        run(container)
    assert not container.killed


@pytest.mark.parametrize("code", [137, 143])
def test_a_container_stopped_from_outside_is_a_sandbox_error(code: int) -> None:
    container = StubContainer(code, {"OOMKilled": False})
    with pytest.raises(SandboxError, match="stopped from outside"):
        run(container)
    assert container.removed


def test_an_out_of_memory_kill_stays_the_case_s_outcome() -> None:
    result = run(StubContainer(137, {"OOMKilled": True}))
    assert result.oom_killed and result.exit_code == 137 and not result.timed_out


@pytest.mark.parametrize("code", [0, 1, 70])
def test_the_runner_s_own_exit_codes_are_results(code: int) -> None:
    result = run(StubContainer(code, {"OOMKilled": False}))
    assert result.exit_code == code and not result.timed_out


class ReapedContainer:
    def __init__(self, labels: dict[str, str], fails_with: BaseException | None) -> None:
        self.labels = labels
        self.fails_with = fails_with

    def remove(self, force: bool) -> None:
        if self.fails_with is not None:
            raise self.fails_with


class ReapClient:
    """Lists what the reaper asks for the way the SDK does with ignore_removed=True."""

    def __init__(self, containers: list[ReapedContainer]) -> None:
        self.listed: list[dict[str, Any]] = []
        self._containers = containers

        outer = self

        class Containers:
            def list(self, **kwargs: Any) -> list[ReapedContainer]:
                outer.listed.append(kwargs)
                return outer._containers

        self.containers = Containers()

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        pass


def test_a_reap_racing_another_removal_is_not_an_engine_failure() -> None:
    # A container whose removal is already in progress (409) or done (404) is not ours to
    # count, and not an error: two reapers (a heartbeat and the orphan pass) may race.
    client = ReapClient(
        [
            ReapedContainer({}, api_error(409, "removal of container c is already in progress")),
            ReapedContainer({}, docker.errors.NotFound("No such container: c")),
            ReapedContainer({}, None),
        ]
    )
    sandbox = DockerSandbox(Settings(), client=client)  # type: ignore[arg-type]
    assert sandbox.reap({}) == 1
    # and a container removed between the listing and its inspection is skipped by the SDK
    assert client.listed[0]["ignore_removed"] is True


def test_a_reap_still_reports_a_real_engine_error() -> None:
    client = ReapClient([ReapedContainer({}, api_error(500, "driver failed"))])
    sandbox = DockerSandbox(Settings(), client=client)  # type: ignore[arg-type]
    with pytest.raises(SandboxError):
        sandbox.reap({})


class RemovedElsewhere(StubContainer):
    """A container whose removal another thread began first (the heartbeat's reap on a
    cancel): remove() answers 409, and the engine drops it a moment later."""

    def __init__(self) -> None:
        super().__init__(0)
        self.gone = threading.Event()
        self.waited_for: list[str] = []

    def remove(self, force: bool = False) -> None:
        threading.Timer(0.2, self.gone.set).start()
        raise api_error(409, "removal of container c0ffee is already in progress")

    def wait(self, timeout: float, condition: str = "not-running") -> dict[str, Any]:
        if condition == "removed":
            self.waited_for.append(condition)
            assert self.gone.wait(timeout)
            return {"StatusCode": 0}
        return super().wait(timeout)


def test_a_run_returns_only_once_its_container_is_gone() -> None:
    # Else a gate's verdict (written once its cases' runs return) could land while one of
    # its containers still exists, as a cancel's did.
    container = RemovedElsewhere()
    run(container)
    assert container.waited_for == ["removed"] and container.gone.is_set()


def test_a_container_already_gone_is_not_waited_for() -> None:
    class Gone(StubContainer):
        def remove(self, force: bool = False) -> None:
            raise docker.errors.NotFound("no such container")

        def wait(self, timeout: float, condition: str = "not-running") -> dict[str, Any]:
            assert condition != "removed", "a container already gone was waited for"
            return super().wait(timeout)

    assert run(Gone(0)).exit_code == 0


def test_the_stderr_of_a_runner_that_judged_is_not_read() -> None:
    # One engine call less per case: only a runner that broke has its stderr looked at.
    judged = StubContainer(0)
    judged.stdout = b"===GATE-RUNNER-RESULT-BEGIN===\n{}\n===GATE-RUNNER-RESULT-END===\n"
    result = run(judged)
    assert result.stdout == judged.stdout and result.stderr == b""
    assert [call["stdout"] for call in judged.logs_read] == [True]


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
    broke = StubContainer(code)
    broke.stdout = stdout
    result = run(broke)
    assert result.stderr == b"the runner's stderr"
    assert [call["stdout"] for call in broke.logs_read] == [True, False]


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

"""The one-stage build's step (sandbox/docker/test_image.py) against a stub engine: its wait at
the time limit, and the archive the bundle goes in as."""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import requests.exceptions

from gate_service.config import Settings
from gate_service.sandbox import BuildRefused, SandboxError
from gate_service.sandbox.docker import DockerSandbox
from gate_service.sandbox.docker.test_image import _root_owned_tar


class SlowEngineApi:
    """An engine that never answers a wait in time, whatever the step's state."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.waits = 0

    def wait(self, container: str, timeout: float) -> dict[str, Any]:
        self.waits += 1
        time.sleep(timeout)
        raise requests.exceptions.ReadTimeout("read timed out")

    def inspect_container(self, container: str) -> dict[str, Any]:
        return {"State": self.state}


class StubClient:
    def __init__(self, api: Any) -> None:
        self.api = api

    def ping(self) -> bool:
        return True


def wait_for_step(state: dict[str, Any]) -> SlowEngineApi:
    api = SlowEngineApi(state)
    sandbox = DockerSandbox(Settings(), client=StubClient(api))  # type: ignore[arg-type]
    sandbox._wait_for_step("step", "building", time.monotonic() + 0.3, 0.3, None)
    return api


def test_a_step_that_exited_while_the_engine_was_slow_to_say_so_is_not_refused() -> None:
    api = wait_for_step({"Status": "exited", "ExitCode": 0})
    assert api.waits >= 1


def test_a_step_still_running_at_the_time_limit_is_refused() -> None:
    with pytest.raises(BuildRefused, match=r"took longer than 0\.3 s"):
        wait_for_step({"Status": "running", "ExitCode": 0})


def test_the_bundle_goes_in_root_owned_under_bundle_without_special_bits(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "tools").mkdir(parents=True)
    (bundle / "tools" / "calc.py").write_text("x = 1\n")
    os.chmod(bundle / "tools" / "calc.py", 0o4755)
    _root_owned_tar(bundle, tmp_path / "b.tar")
    with tarfile.open(tmp_path / "b.tar") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"bundle/tools", "bundle/tools/calc.py"}  # not /bundle itself
    assert all(m.uid == 0 and m.gid == 0 and not m.uname for m in members.values())
    assert members["bundle/tools/calc.py"].mode == 0o755


def test_a_link_in_the_bundle_is_never_archived_for_the_root_step(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "tools").mkdir(parents=True)
    (bundle / "tools" / "__pycache__").symlink_to("/etc")
    with pytest.raises(SandboxError, match="neither a file nor a directory"):
        _root_owned_tar(bundle, tmp_path / "b.tar")


class KilledStepApi:
    """A step the engine reports ended by a kill: out of memory, or from outside."""

    def __init__(self, oom: bool) -> None:
        self.oom = oom

    def wait(self, container: str, timeout: float) -> dict[str, Any]:
        return {"StatusCode": 137}

    def inspect_container(self, container: str) -> dict[str, Any]:
        return {"State": {"Status": "exited", "ExitCode": 137, "OOMKilled": self.oom}}

    # The log read (engine.read_logs): docker-py's request and demultiplexing.
    def _url(self, path: str, *args: str) -> str:
        return path.format(*args)

    def _get(self, url: str, params: dict[str, Any], stream: bool) -> dict[str, Any]:
        assert url == "/containers/step/logs" and params["tail"] == 20
        return params

    def _get_result_tty(self, stream: bool, params: dict[str, Any], is_tty: bool) -> bytes:
        return b"Killed\n"


def wait_for_killed_step(oom: bool) -> None:
    sandbox = DockerSandbox(Settings(), client=StubClient(KilledStepApi(oom)))  # type: ignore[arg-type]
    sandbox._wait_for_step("step", "building", time.monotonic() + 5, 5, None)


def test_a_step_out_of_memory_refuses_the_bundle() -> None:
    with pytest.raises(BuildRefused, match="took more than 1024 MiB of memory"):
        wait_for_killed_step(oom=True)


def test_a_step_killed_from_outside_is_an_engine_error_with_its_log() -> None:
    with pytest.raises(SandboxError, match="exited with code 137\nKilled"):
        wait_for_killed_step(oom=False)


class _Stop(Exception):
    """Ends the build once the step's host config is made: nothing else is under test."""


class HostConfigApi:
    """Records the step's host config; the engine's default runtime is ``default``."""

    def __init__(self, default: str) -> None:
        self.default = default
        self.host: dict[str, Any] = {}

    def create_host_config(self, **host: Any) -> dict[str, Any]:
        self.host = host
        return host


class HostConfigClient(StubClient):
    class images:  # docker-py's attribute name
        @staticmethod
        def get(name: str) -> Any:
            raise _Stop

    def info(self) -> dict[str, Any]:
        return {"DefaultRuntime": self.api.default, "Runtimes": {"runc": {}, "runsc": {}}}


def step_host(tmp_path: Path, default: str, **settings: Any) -> dict[str, Any]:
    """The host config of a one-stage build's step, on an engine whose default is ``default``."""
    from gate_service.sandbox import TestImageSpec

    (tmp_path / "bundle").mkdir(exist_ok=True)
    api = HostConfigApi(default)
    sandbox = DockerSandbox(Settings(**settings), client=HostConfigClient(api))  # type: ignore[arg-type]
    sandbox.runner_image = lambda: "runner:test"  # type: ignore[method-assign]
    with pytest.raises(_Stop):
        sandbox.build_test_image(TestImageSpec(tag="gate-test:x", context_dir=tmp_path))
    return api.host


def test_under_gvisor_the_build_step_gets_a_cases_task_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step runs a bundle's code (its compile and plan), so under gVisor its tasks are
    held in gVisor's kernel and its host pids sized for them, as a case's are."""
    for name in ("GATE_CASE_RUNTIME", "GATE_CASE_GVISOR_TASKS"):
        monkeypatch.delenv(name, raising=False)

    def nproc(host: dict[str, Any]) -> list[tuple[int, int]]:
        return [(u.soft, u.hard) for u in host["ulimits"] if u.name == "nproc"]

    runc = step_host(tmp_path, "runc")
    assert (runc["pids_limit"], nproc(runc), runc["runtime"]) == (64, [], None)
    named = step_host(tmp_path, "runc", case_runtime="runsc")
    assert (named["pids_limit"], nproc(named), named["runtime"]) == (1088, [(16, 16)], "runsc")
    # The engine's default runtime is gVisor's: the same limits, though no setting names it.
    default = step_host(tmp_path, "runsc")
    assert (default["pids_limit"], nproc(default)) == (1088, [(16, 16)])

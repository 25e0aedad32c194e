"""The Docker backend's connection to the engine, and how the engine's failures surface.

Every part of the backend works through one ``DockerEngine``: the settings, one docker SDK
client (its HTTP session is not safely shared between threads, so one per worker), and the
wire that case containers are made, run and removed through (wire.py).
``docker_errors`` turns any failure of the engine or of the connection to it into the port's
SandboxError, an infrastructure error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import Ulimit

from ...config import Settings
from ..port import SandboxError, SandboxSettingError
from . import wire
from .wire import EngineCallError

MIB = 1024 * 1024
# Seconds between looks at the job's halt event while an image builds or a case runs.
HALT_POLL_SECONDS = 0.2

DOCKER_ERRORS = (
    docker.errors.DockerException,
    requests.exceptions.RequestException,
    EngineCallError,  # the case path's own calls (wire.py)
)


@contextmanager
def docker_errors(action: str) -> Iterator[None]:
    """Every engine failure surfaces as SandboxError, an infrastructure error."""
    try:
        yield
    except docker.errors.BuildError as exc:
        tail = "".join(
            str(chunk.get("stream") or chunk.get("error") or "") for chunk in exc.build_log
        )[-2000:]
        raise SandboxError(f"{action} failed: {exc.msg}\n{tail}") from None
    except DOCKER_ERRORS as exc:
        raise SandboxError(f"{action} failed: {exc}") from None


def read_logs(
    api: Any,
    container_id: str,
    *,
    stdout: bool = False,
    stderr: bool = False,
    tail: int | str = "all",
) -> bytes:
    """A stopped container's output, as docker-py's ``logs()`` reads it, less the inspect that
    it makes before every read to ask whether the container has a TTY (ours never do): an
    engine call per read that nothing here needs (docker 7.1's ``_check_is_tty``)."""
    params = {
        "stdout": int(stdout),
        "stderr": int(stderr),
        "timestamps": 0,
        "follow": 0,
        "tail": tail,
    }
    response = api._get(api._url("/containers/{0}/logs", container_id), params=params, stream=False)
    return bytes(api._get_result_tty(False, response, False))


def task_ulimits(guest_tasks: int | None) -> list[Ulimit]:
    """The nproc ulimit that holds a container's tasks in its own kernel (RunLimits.guest_tasks:
    gVisor's), or none: on the host's kernel nproc counts a uid across the machine."""
    if guest_tasks is None:
        return []
    return [Ulimit(name="nproc", soft=guest_tasks, hard=guest_tasks)]


# How an operator gives Docker gVisor's runtime (docs/threat-model.md, "Under gVisor").
RUNSC_CONFIG = (
    '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": '
    '["--network=none", "--fsgofer-host-uds"]}}}'
)


def engine_runtime(info: dict[str, Any], wanted: str | None) -> str:
    """The runtime case containers get: ``wanted`` (GATE_CASE_RUNTIME) when the engine has
    it, else SandboxSettingError naming it and how to register it; unset, the engine's
    default (``DefaultRuntime``, runc unless its operator changed it)."""
    runtimes = info.get("Runtimes") or {}
    if wanted is None:
        return str(info.get("DefaultRuntime") or "runc")
    if wanted in runtimes:
        return wanted
    known = ", ".join(sorted(runtimes)) or "none"
    raise SandboxSettingError(
        f"GATE_CASE_RUNTIME is {wanted!r}, and the Docker engine has no runtime of that name "
        f"(it has: {known}). Register it in the engine's daemon.json and restart the engine"
        + (f", for gVisor: {RUNSC_CONFIG}" if wanted == "runsc" else "")
        + "; or unset GATE_CASE_RUNTIME to run cases under the engine's default"
    )


class DockerEngine:
    """The settings and the engine client that each part of the backend works through."""

    def __init__(self, settings: Settings, client: docker.DockerClient | None = None) -> None:
        self.settings = settings
        with docker_errors("connecting to the Docker engine"):
            self.client = client or docker.from_env(timeout=120)
            api: Any = getattr(self.client, "api", None)
            if str(getattr(api, "base_url", "")).startswith("http+docker://"):
                # A local socket (unix, npipe, ssh): no proxy or .netrc can apply, and looking
                # for them costs requests a fifth of each engine call's CPU.
                api.trust_env = False
            self.client.ping()
            # GATE_CASE_RUNTIME, checked once per connection: a runtime the engine does not
            # have stops a worker at start-up, not each case.
            self._runtime = (
                engine_runtime(self.client.info(), settings.case_runtime)
                if settings.case_runtime is not None
                else None
            )
        # The case path's calls: on a wire of our own when the engine's transport allows.
        self.wire: wire.Wire = wire.of(getattr(self.client, "api", None))

    @property
    def runtime(self) -> str:
        """The OCI runtime its case containers run under: GATE_CASE_RUNTIME, or the engine's
        default (asked once, when first read)."""
        if self._runtime is None:
            with docker_errors("asking the Docker engine for its default runtime"):
                self._runtime = engine_runtime(self.client.info(), None)
        return self._runtime

    def close(self) -> None:
        self.wire.close()
        self.client.close()

"""The Docker backend's connection to the engine, and how the engine's failures surface.

Every part of the backend works through one ``DockerEngine``: the settings and one docker SDK
client (its HTTP session is not safely shared between threads, so one per worker).
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
import urllib3.exceptions

from ...config import Settings
from ..port import SandboxError

MIB = 1024 * 1024
# Seconds between looks at the job's halt event while an image builds or a case runs.
HALT_POLL_SECONDS = 0.2

DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


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


def read_timed_out(exc: BaseException) -> bool:
    """Whether a failed wait is its own read timeout, in either shape requests gives it.

    ReadTimeout when the engine sent nothing at all; but the engine answers a wait with its
    headers at once and the body only when the container ends, so a wait cut at the wall
    deadline times out reading the body, which requests raises as a ConnectionError around
    urllib3's ReadTimeoutError (docker 7.1, requests 2.34).
    """
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    return isinstance(exc, requests.exceptions.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args
    )


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

    def close(self) -> None:
        self.client.close()

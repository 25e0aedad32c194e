"""The Docker implementation of the sandbox port: images and hardened case containers."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import LogConfig

from ..config import BaseImageSource, Settings
from ..errors import SandboxError
from . import LABEL, RunLimits, RunResult, TestImageSpec

log = logging.getLogger(__name__)

CASE_USER = "10001:10001"
DEBOOTSTRAP_TAG = "gate-base:bookworm-debootstrap"
DEBOOTSTRAP_PACKAGES = "python3,python3-venv,ca-certificates"

TEST_DOCKERFILE = """\
FROM {runner}
COPY --chown=0:0 bundle/ /bundle/
"""
TEST_DOCKERFILE_WHEELS = """\
USER 0:0
COPY wheels/ /tmp/bundle-wheels/
RUN /opt/gate-runner/bin/pip install --no-cache-dir --disable-pip-version-check --no-index \\
        --find-links /tmp/bundle-wheels -r /bundle/requirements.txt \\
 && rm -rf /tmp/bundle-wheels
USER {user}
"""

_DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


@contextmanager
def _docker_errors(action: str) -> Iterator[None]:
    """Every engine failure surfaces as SandboxError, an infrastructure error."""
    try:
        yield
    except docker.errors.BuildError as exc:
        tail = "".join(
            str(chunk.get("stream") or chunk.get("error") or "") for chunk in exc.build_log
        )[-2000:]
        raise SandboxError(f"{action} failed: {exc.msg}\n{tail}") from None
    except _DOCKER_ERRORS as exc:
        raise SandboxError(f"{action} failed: {exc}") from None


def apt_mirror() -> str:
    """The Debian mirror apt already uses here; debootstrap then needs no other host."""
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            match = re.match(r"^\s*(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", line)
            if match and "security" not in match.group(1):
                return match.group(1)
    return "http://deb.debian.org/debian"


def pip_environment() -> dict[str, str]:
    """Only what pip needs: the service's secrets must never reach it (or its messages)."""
    keep = {
        "PATH", "HOME", "LANG", "LC_ALL", "SSL_CERT_FILE", "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST",
        "PIP_CERT", "PIP_CONFIG_FILE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
        "http_proxy", "https_proxy", "no_proxy",
    }  # fmt: skip
    return {k: v for k, v in os.environ.items() if k in keep}


class DockerSandbox:
    """Builds the runner and test images and runs one hardened container per case."""

    def __init__(self, settings: Settings, client: docker.DockerClient | None = None) -> None:
        self.settings = settings
        with _docker_errors("connecting to the Docker engine"):
            self.client = client or docker.from_env(timeout=120)
            self.client.ping()
        self._lock = threading.Lock()
        self._runner_tag: str | None = None

    # -- images ---------------------------------------------------------------------------

    def image_exists(self, tag: str) -> bool:
        try:
            self.client.images.get(tag)
        except docker.errors.ImageNotFound:
            return False
        except _DOCKER_ERRORS as exc:
            raise SandboxError(f"inspecting image {tag} failed: {exc}") from None
        return True

    def base_image(self) -> str:
        """The image the runner is built FROM, per GATE_BASE_IMAGE and its source setting."""
        s = self.settings
        if s.base_image_source is not BaseImageSource.debootstrap:
            if self.image_exists(s.base_image):
                return s.base_image
            try:
                log.info("pulling base image %s", s.base_image)
                self.client.images.pull(s.base_image)
                return s.base_image
            except _DOCKER_ERRORS as exc:
                if s.base_image_source is BaseImageSource.pull:
                    raise SandboxError(
                        f"base image {s.base_image} is not present and cannot be pulled: {exc}"
                    ) from None
                log.info(
                    "cannot pull %s (%s); bootstrapping a Debian base instead", s.base_image, exc
                )
        if self.image_exists(DEBOOTSTRAP_TAG):
            return DEBOOTSTRAP_TAG
        self._debootstrap()
        return DEBOOTSTRAP_TAG

    def _debootstrap(self) -> None:
        if shutil.which("debootstrap") is None:
            raise SandboxError(
                "no base image: GATE_BASE_IMAGE cannot be pulled and debootstrap is not "
                "installed (apt-get install debootstrap, or load python:3.11-slim into the engine)"
            )
        mirror = self.settings.debootstrap_mirror or apt_mirror()
        work = Path(tempfile.mkdtemp(prefix="gate-base-", dir=self.settings.runtime_dir()))
        try:
            rootfs, tarball = work / "rootfs", work / "rootfs.tar"
            log.info("building the base image with debootstrap from %s (about a minute)", mirror)
            started = time.monotonic()
            proc = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={DEBOOTSTRAP_PACKAGES}",
                    "bookworm",
                    str(rootfs),
                    mirror,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise SandboxError(f"debootstrap failed ({proc.returncode}): {proc.stderr[-2000:]}")
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
            repo, tag = DEBOOTSTRAP_TAG.split(":")
            with _docker_errors("importing the base image"):
                self.client.api.import_image_from_file(str(tarball), repository=repo, tag=tag)
            log.info("base image %s ready in %.0f s", DEBOOTSTRAP_TAG, time.monotonic() - started)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _runner_digest(self, base: str) -> str:
        src = self.settings.runner_source_dir
        h = hashlib.sha256(base.encode())
        for path in sorted(
            [src / "Dockerfile", src / "requirements.txt", *(src / "gate_runner").rglob("*.py")]
        ):
            h.update(path.relative_to(src).as_posix().encode())
            h.update(path.read_bytes())
        return h.hexdigest()[:12]

    def runner_image(self) -> str:
        with self._lock:
            if self._runner_tag and self.image_exists(self._runner_tag):
                return self._runner_tag
            base = self.base_image()
            tag = f"gate-runner:{self._runner_digest(base)}"
            if not self.image_exists(tag):
                self._build_runner(base, tag)
            self._runner_tag = tag
            return tag

    def _pip_sources(self) -> list[str]:
        s = self.settings
        args: list[str] = []
        if s.wheelhouse_dir:
            args += ["--find-links", str(s.wheelhouse_dir)]
        if s.pip_offline:
            args.append("--no-index")
        elif s.pip_index_url:
            args += ["--index-url", s.pip_index_url]
        return args

    def download_wheels(self, requirements: Path, dest: Path) -> None:
        """Fetch wheels on the host; --only-binary means no package code runs here."""
        dest.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--disable-pip-version-check",
                "--only-binary=:all:",
                "--dest",
                str(dest),
                "-r",
                str(requirements),
                *self._pip_sources(),
            ],
            capture_output=True,
            text=True,
            check=False,
            env=pip_environment(),
        )
        if proc.returncode != 0:
            raise WheelDownloadError(proc.stderr.strip()[-2000:] or proc.stdout[-2000:])

    def _build_runner(self, base: str, tag: str) -> None:
        src = self.settings.runner_source_dir
        log.info("building runner image %s FROM %s", tag, base)
        with tempfile.TemporaryDirectory(prefix="gate-runner-ctx-") as tmp:
            ctx = Path(tmp)
            shutil.copy(src / "Dockerfile", ctx / "Dockerfile")
            shutil.copy(src / "requirements.txt", ctx / "requirements.txt")
            shutil.copytree(
                src / "gate_runner",
                ctx / "gate_runner",
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
            try:
                self.download_wheels(src / "requirements.txt", ctx / "wheels")
            except WheelDownloadError as exc:
                raise SandboxError(f"cannot fetch the runner's wheels: {exc}") from None
            with _docker_errors(f"building {tag}"):
                self.client.images.build(
                    path=str(ctx),
                    tag=tag,
                    buildargs={"BASE_IMAGE": base},
                    rm=True,
                    forcerm=True,
                    pull=False,
                    network_mode="none",
                    labels={LABEL: "runner"},
                )

    def build_test_image(self, spec: TestImageSpec) -> str:
        dockerfile = TEST_DOCKERFILE.format(runner=self.runner_image())
        if spec.with_wheels:
            dockerfile += TEST_DOCKERFILE_WHEELS.format(user=CASE_USER)
        (spec.context_dir / "Dockerfile").write_text(dockerfile)
        with _docker_errors(f"building test image {spec.tag}"):
            self.client.images.build(
                path=str(spec.context_dir),
                tag=spec.tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
                labels={LABEL: "test", **spec.labels},
            )
        return spec.tag

    # -- containers -----------------------------------------------------------------------

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Mapping[str, str],
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        kwargs: dict[str, Any] = {
            "command": list(argv),
            "user": CASE_USER,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={limits.tmpfs_mb}m,mode=1777"},
            "pids_limit": limits.pids,
            "mem_limit": f"{limits.memory_mb}m",
            "memswap_limit": f"{limits.memory_mb}m",
            "nano_cpus": int(limits.cpus * 1e9),
            "network_mode": limits.network,
            "labels": {LABEL: "case", **labels},
            "environment": dict(env or {}),
            "working_dir": "/bundle",
            # Rotation keeps the tail, which is where the runner's result is.
            "log_config": LogConfig(
                type="json-file",
                config={"max-size": str(limits.output_limit_bytes), "max-file": "1"},
            ),
        }
        started = time.monotonic()
        with _docker_errors(f"running a case container from {image}"):
            container = self.client.containers.create(image, **kwargs)
        timed_out = False
        try:
            with _docker_errors("starting a case container"):
                container.start()
            try:
                status = container.wait(timeout=limits.wall_seconds)
                exit_code: int | None = int(status.get("StatusCode", -1))
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                timed_out, exit_code = True, None
                with _docker_errors("stopping a timed-out case container"):
                    container.kill()
            duration_ms = int((time.monotonic() - started) * 1000)
            with _docker_errors("reading a case container's output"):
                container.reload()
                oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
                stdout = container.logs(stdout=True, stderr=False)
                stderr = container.logs(stdout=False, stderr=True, tail=200)
        finally:
            try:
                container.remove(force=True)
            except _DOCKER_ERRORS as exc:
                log.warning("could not remove container %s: %s", container.id, exc)
        truncated = len(stdout) > limits.output_limit_bytes
        return RunResult(
            exit_code=exit_code,
            stdout=stdout[-limits.output_limit_bytes :],
            stderr=stderr[-64_000:],
            duration_ms=duration_ms,
            timed_out=timed_out,
            oom_killed=oom,
            output_truncated=truncated,
        )

    def reap(
        self,
        labels: Mapping[str, str],
        *,
        keep: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> int:
        filters: dict[str, str | list[str] | bool] = {
            "label": [LABEL, *(f"{k}={v}" for k, v in labels.items())]
        }
        removed = 0
        with _docker_errors("removing containers"):
            for container in self.client.containers.list(all=True, filters=filters):
                if keep is not None and keep(container.labels or {}):
                    continue
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    continue  # gone already (its own run() removed it)
                removed += 1
        return removed

    def close(self) -> None:
        self.client.close()


class WheelDownloadError(Exception):
    """pip could not fetch a bundle's or the runner's requirements as wheels."""

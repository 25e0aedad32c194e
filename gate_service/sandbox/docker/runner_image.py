"""The base image (GATE_BASE_IMAGE, pulled, or bootstrapped from Debian with debootstrap)
and the runner image built FROM it, tagged by the runner digest (recipes.runner_digest)."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import docker

from ...bundles.requirements import read_requirements
from ...bundles.wheels import WheelDownloadError, fetch_wheels
from ...config import BaseImageSource, Settings
from ...scratch import scratch_dir
from ..port import LABEL, SandboxError
from .engine import DOCKER_ERRORS, docker_errors
from .images import DockerImages
from .recipes import runner_digest

log = logging.getLogger(__name__)

DEBOOTSTRAP_TAG = "gate-base:bookworm-debootstrap"
DEBOOTSTRAP_PACKAGES = "python3,python3-venv,ca-certificates"


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


class RunnerImages(DockerImages):
    """Makes sure the runner image exists, building it (and its base) when it is missing."""

    def __init__(self, settings: Settings, client: docker.DockerClient | None = None) -> None:
        super().__init__(settings, client)
        self._lock = threading.Lock()
        self._runner_tag: str | None = None

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
            except DOCKER_ERRORS as exc:
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
        with scratch_dir(self.settings, "base-") as work:
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
            with docker_errors("importing the base image"):
                self.client.api.import_image_from_file(str(tarball), repository=repo, tag=tag)
            log.info("base image %s ready in %.0f s", DEBOOTSTRAP_TAG, time.monotonic() - started)

    def runner_image(self) -> str:
        with self._lock:
            if self._runner_tag and self.image_exists(self._runner_tag):
                return self._runner_tag
            base = self.base_image()
            tag = f"gate-runner:{runner_digest(self.settings.runner_source_dir, base)}"
            if not self.image_exists(tag):
                self._build_runner(base, tag)
            self._runner_tag = tag
            return tag

    def _build_runner(self, base: str, tag: str) -> None:
        src = self.settings.runner_source_dir
        log.info("building runner image %s FROM %s", tag, base)
        with scratch_dir(self.settings, "runner-") as ctx:
            shutil.copy(src / "Dockerfile", ctx / "Dockerfile")
            shutil.copy(src / "requirements.txt", ctx / "requirements.txt")
            shutil.copytree(
                src / "gate_runner",
                ctx / "gate_runner",
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
            # Our own file, but read the same way as a bundle's: requirements, not pip input.
            report = read_requirements(src / "requirements.txt")
            if report.problems:
                raise SandboxError(f"the runner's requirements.txt is invalid: {report.problems}")
            try:
                fetch_wheels(self.settings, report.requirements, ctx / "wheels")
            except WheelDownloadError as exc:
                raise SandboxError(f"cannot fetch the runner's wheels: {exc}") from None
            with docker_errors(f"building {tag}"):
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

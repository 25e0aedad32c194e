"""The Docker implementation of the sandbox port: images and hardened case containers."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import LogConfig, Ulimit

from ..bundles.requirements import read_requirements
from ..bundles.wheels import WheelDownloadError, fetch_wheels
from ..config import BaseImageSource, Settings
from ..scratch import scratch_dir
from .port import (
    BUILD_ID_LABEL,
    BUILD_IMAGE_LABEL,
    BUILD_STAGE,
    BUNDLE_DEPS_DIR,
    INVOCATION_UID,
    LABEL,
    BuildRefused,
    Halted,
    ImageInfo,
    RunLimits,
    RunResult,
    SandboxError,
    TestImageSpec,
)

log = logging.getLogger(__name__)

MIB = 1024 * 1024
DEBOOTSTRAP_TAG = "gate-base:bookworm-debootstrap"
DEBOOTSTRAP_PACKAGES = "python3,python3-venv,ca-certificates"

# The bundle's Python files (and its dependencies') are compiled here, once per image: a case
# container's root is read-only and PYTHONDONTWRITEBYTECODE is set, and every invocation
# imports the project afresh, so without this each one would compile the same sources again.
# Compiling runs no bundle code; a file that does not compile is left for its invocation to
# report. The image's user goes back to the runner image's own afterwards.
#
# Each stage starts with LABEL {stage_labels} (see build_labels): the engine's classic builder
# (what the API's /build runs when not asked for version=2, and docker-py never asks) keeps
# every step of every stage as an image, and its own `labels` go only on the last step of
# the last stage. Labelled from their first step, the images of the dependency stage (the
# wheels and the installed packages: 879 MB for numpy) and of a build cut half-way are
# found by this build's id and removed when it ends, or by garbage collection after a crash.
TEST_DOCKERFILE = """\
FROM {runner}
LABEL {stage_labels}
COPY --chown=0:0 bundle/ /bundle/
USER 0:0
RUN {compile_bundle}
USER {runner_user}
"""
# With requirements, two stages: `deps` installs the bundle's wheels into BUNDLE_DEPS_DIR
# (never into the runner's venv, so no wheel can replace a runner module or add a .pth hook
# to the runner's interpreter), and the final image copies only that directory, so the
# wheels themselves never reach it. Every RUN is exec form: the requirement strings are JSON
# arguments to pip that no shell ever sees. chmod leaves the directory root-owned and
# writable by root alone (the case's invocations run as another uid).
TEST_DOCKERFILE_DEPS = """\
FROM {runner} AS deps
LABEL {stage_labels}
USER 0:0
COPY wheels/ /tmp/bundle-wheels/
RUN {mkdir}
RUN {install}
RUN {compile_deps}
RUN {chmod}

FROM {runner}
LABEL {stage_labels}
COPY --chown=0:0 bundle/ /bundle/
COPY --from=deps --chown=0:0 {deps}/ {deps}/
USER 0:0
RUN {compile_bundle}
USER {runner_user}
"""
BUNDLE_WHEELS_DIR = "/tmp/bundle-wheels"
COMPILE_MAX_FILE_BYTES = 2 * MIB
# Seconds between looks at the job's halt event while an image builds or a case runs.
HALT_POLL_SECONDS = 0.2
# A cut or failed test-image build: how long to wait, at most, for the engine to remove its
# last step's container, and the time between two looks (see DockerSandbox._settle_build).
BUILD_SETTLE_SECONDS = 30.0
SETTLE_LOOK_SECONDS = 0.5

_DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)
# A case container's exit codes that only a signal from outside it can cause: the runner runs
# under an init as root, which nothing in the case can signal, and an out-of-memory kill is
# reported as OOMKilled. The engine's own stop (SIGTERM, then SIGKILL) when it shuts down or
# restores its containers after a crash ends a case this way.
STOPPED_FROM_OUTSIDE = frozenset({128 + signal.SIGKILL, 128 + signal.SIGTERM})


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


def runner_digest(src: Path, base: str) -> str:
    """The runner image's tag: its base and the bytes of its build context under `src`.

    Only the files the build reads, by their paths relative to `src`, so a checkout's
    runner_image/ and a wheel's gate_service/runner_image give the same tag.
    """
    h = hashlib.sha256(base.encode())
    for path in sorted(
        [src / "Dockerfile", src / "requirements.txt", *(src / "gate_runner").rglob("*.py")]
    ):
        h.update(path.relative_to(src).as_posix().encode())
        h.update(path.read_bytes())
    # Test image tags end in this digest, so the recipes they are built by count too: a
    # changed test Dockerfile must never reuse images built by the old one.
    h.update(TEST_DOCKERFILE.encode())
    h.update(TEST_DOCKERFILE_DEPS.encode())
    h.update(json.dumps(_compile_command("/bundle")).encode())
    return h.hexdigest()[:12]


# What a label key or value in our Dockerfiles may hold: ours only (tags, hex ids), never
# the bundle's text, and nothing the Dockerfile parser would read as quoting or a variable.
_LABEL_TEXT = re.compile(r"[A-Za-z0-9._:/@-]+")


def build_labels(spec: TestImageSpec, build_id: str) -> dict[str, str]:
    """The labels of every image one test-image build makes besides the test image."""
    return {
        **spec.labels,
        LABEL: BUILD_STAGE,
        BUILD_ID_LABEL: build_id,
        BUILD_IMAGE_LABEL: spec.tag,
    }


def _label_instruction(labels: Mapping[str, str]) -> str:
    pairs = []
    for key, value in sorted(labels.items()):
        if not (_LABEL_TEXT.fullmatch(key) and _LABEL_TEXT.fullmatch(value)):
            raise ValueError(f"a build label must match {_LABEL_TEXT.pattern}: {key}={value}")
        pairs.append(f'"{key}"="{value}"')
    return " ".join(pairs)


def bundle_dockerfile(
    runner: str, requirements: Sequence[str], stage_labels: Mapping[str, str]
) -> str:
    """The test image's Dockerfile: the runner, the bundle and, if any, its dependencies.

    Every stage is labelled with ``stage_labels`` from its first step (see TEST_DOCKERFILE).
    """
    compiled = {
        "compile_bundle": json.dumps(_compile_command("/bundle")),
        "runner_user": f"{INVOCATION_UID}:{INVOCATION_UID}",
        "stage_labels": _label_instruction(stage_labels),
    }
    if not requirements:
        return TEST_DOCKERFILE.format(runner=runner, **compiled)
    install = [
        "/opt/gate-runner/bin/pip", "install",
        "--no-cache-dir", "--disable-pip-version-check", "--no-input",
        "--no-index", "--find-links", BUNDLE_WHEELS_DIR,
        "--only-binary=:all:", "--no-compile",
        "--target", BUNDLE_DEPS_DIR,
        "--", *requirements,
    ]  # fmt: skip
    return TEST_DOCKERFILE_DEPS.format(
        runner=runner,
        mkdir=json.dumps(["/bin/mkdir", "-p", BUNDLE_DEPS_DIR]),
        install=json.dumps(install),
        compile_deps=json.dumps(_compile_command(BUNDLE_DEPS_DIR)),
        chmod=json.dumps(["/bin/chmod", "-R", "u=rwX,go=rX", BUNDLE_DEPS_DIR]),
        deps=BUNDLE_DEPS_DIR,
        **compiled,
    )


def _compile_command(directory: str) -> list[str]:
    """Exec-form argv that writes __pycache__ for the .py files under ``directory``.

    Only compiles: nothing is imported or run, and links are not followed. A file that does
    not compile (or is over COMPILE_MAX_FILE_BYTES, which bounds the build's memory) is left
    as it is, for its invocation to compile or report; the step itself never fails the build.
    """
    script = (
        "import os, py_compile\n"
        f"for d, _, names in os.walk({directory!r}):\n"
        "    for n in names:\n"
        "        p = os.path.join(d, n)\n"
        "        try:\n"
        "            if (n.endswith('.py') and not os.path.islink(p) and os.path.isfile(p)\n"
        f"                    and os.path.getsize(p) <= {COMPILE_MAX_FILE_BYTES}):\n"
        "                py_compile.compile(p, doraise=True)\n"
        "        except Exception:\n"
        "            pass\n"
    )
    return ["/opt/gate-runner/bin/python", "-I", "-c", script]


def _build_response(stream: Any) -> Any:
    """The HTTP response behind the generator that docker-py's ``api.build`` returns.

    ``api.build`` posts the request itself and returns ``_stream_helper(response, ...)``, a
    generator not yet started, whose frame holds the response: the only handle from which a
    build that is blocked reading a silent step can be cut off.
    """
    frame = getattr(stream, "gi_frame", None)
    return None if frame is None else frame.f_locals.get("response")


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
            with _docker_errors("importing the base image"):
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

    def build_test_image(self, spec: TestImageSpec, *, halt: threading.Event | None = None) -> str:
        """Build the bundle's test image; whatever else the build made is removed as it ends."""
        build_id = uuid.uuid4().hex
        dockerfile = bundle_dockerfile(
            self.runner_image(), spec.requirements, build_labels(spec, build_id)
        )
        (spec.context_dir / "Dockerfile").write_text(dockerfile)
        finished = False
        try:
            self._build(
                f"building test image {spec.tag}",
                timeout_seconds=self.settings.build_timeout_seconds,
                output_limit_bytes=self.settings.build_output_limit_bytes,
                path=str(spec.context_dir),
                tag=spec.tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
                # The last step's labels: this image is the test image, not a leftover.
                labels={LABEL: "test", **spec.labels},
                halt=halt,
            )
            finished = True
        finally:
            if not finished:  # cut or failed: let the engine end it before looking
                self._settle_build(build_id)
            self.remove_build_leftovers(build_id, spec.tag)
        return spec.tag

    def _settle_build(self, build_id: str) -> None:
        """Wait for the engine to be done with a build that was cut or failed.

        A cut build (its connection shut down) ends in the engine a moment later: it sees the
        client gone, kills and removes the running step's container, and starts no further
        step, so nothing of the build is committed once no container of it is left. Seen
        empty on two looks SETTLE_LOOK_SECONDS apart (the engine may notice the cut between
        two steps), or after BUILD_SETTLE_SECONDS at most; whatever a late step still commits
        carries the build's labels, and garbage collection removes it.
        """
        deadline = time.monotonic() + BUILD_SETTLE_SECONDS
        empty = 0
        while empty < 2 and time.monotonic() < deadline:
            time.sleep(SETTLE_LOOK_SECONDS)
            try:
                with _docker_errors("listing a build's containers"):
                    busy = self.client.api.containers(
                        all=True, quiet=True, filters={"label": f"{BUILD_ID_LABEL}={build_id}"}
                    )
            except SandboxError as exc:
                log.warning("could not list the containers of build %s: %s", build_id, exc)
                return
            empty = 0 if busy else empty + 1
        if empty < 2:
            log.warning("build %s still had a container after %s s", build_id, BUILD_SETTLE_SECONDS)

    def remove_build_leftovers(self, build_id: str, tag: str) -> int:
        """Remove the images build ``build_id`` made that are not ``tag``'s own layers.

        Its images are found by their BUILD_ID_LABEL; ``tag``'s image and its parents (the
        final stage's steps, which the test image is made of and which go with it) stay. Of
        the rest, the leaves are removed without force and the engine prunes each one's
        untagged parents with it: the dependency stage's whole chain, or the steps a failed or
        cut build committed. Best effort: what stays (an engine error, a container started
        on one meanwhile) is garbage collection's. Returns the images removed.
        """
        try:
            with _docker_errors("listing a build's images"):
                found = self.client.api.images(
                    all=True, filters={"label": f"{BUILD_ID_LABEL}={build_id}"}
                )
                keep: set[str] = set()
                if self.image_exists(tag):
                    keep.add(str(self.client.images.get(tag).id))
        except SandboxError as exc:
            log.warning("could not list the images of build %s: %s", build_id, exc)
            return 0
        parents = {str(i.get("Id")): str(i.get("ParentId") or "") for i in found}
        for image_id in list(keep):  # the test image's parent chain
            parent = parents.get(image_id, "")
            while parent and parent not in keep:
                keep.add(parent)
                parent = parents.get(parent, "")
        has_child = set(parents.values())
        removed = 0
        for image_id in parents:
            if image_id in keep or image_id in has_child:
                continue
            try:
                removed += self.remove_image(image_id)
            except SandboxError as exc:
                log.warning("could not remove image %s of build %s: %s", image_id, build_id, exc)
        return removed

    def _build(
        self,
        action: str,
        *,
        timeout_seconds: float,
        output_limit_bytes: int,
        halt: threading.Event | None = None,
        **kwargs: Any,
    ) -> None:
        """One image build through the streaming API, within a time limit and an output cap.

        Past either limit the connection is shut down, which ends the build in the engine too
        (it cancels a build whose client went away), and BuildRefused is raised: our build
        steps are fixed, so what makes a build slow or loud is the bundle, and a retry would
        hit the same limit. An error the engine reports in the stream stays a SandboxError
        (an infrastructure error, as before), with the tail of the log. ``halt`` set (the job
        was cancelled or its lease lost) cuts the build the same way and raises Halted.
        """
        if halt is not None and halt.is_set():
            raise Halted(f"the job was halted before {action}")
        started = time.monotonic()
        tail: deque[str] = deque(maxlen=200)
        received = 0
        expired = threading.Event()
        with _docker_errors(action):
            # The HTTP read timeout is only a backstop; the timer below cuts the build first.
            stream = self.client.api.build(decode=True, timeout=int(timeout_seconds) + 60, **kwargs)
        response = _build_response(stream)

        def cut() -> None:
            if response is None:
                return
            try:
                # As docker-py's own attach does: the socket under http.client's reader.
                raw = response.raw._fp.fp.raw
                getattr(raw, "_sock", raw).shutdown(socket.SHUT_RDWR)
            except Exception as exc:  # best effort: the connection may be gone already
                log.debug("shutting down a build connection: %s", exc)
            response.close()

        def expire() -> None:
            expired.set()
            cut()

        timer = threading.Timer(max(0.0, started + timeout_seconds - time.monotonic()), expire)
        timer.daemon = True
        timer.start()
        finished, halted = threading.Event(), threading.Event()

        def watch_halt() -> None:
            assert halt is not None
            while not finished.wait(HALT_POLL_SECONDS):
                if halt.is_set():
                    halted.set()
                    cut()
                    return

        if halt is not None:
            threading.Thread(target=watch_halt, name="gate-build-halt", daemon=True).start()
        error: str | None = None
        try:
            try:
                for item in stream:
                    if expired.is_set() or halted.is_set():
                        break
                    chunk: dict[str, Any] = (
                        item if isinstance(item, dict) else {"stream": str(item)}
                    )
                    received += len(json.dumps(chunk))
                    if received > output_limit_bytes:
                        cut()
                        raise BuildRefused(
                            f"the build wrote more than {output_limit_bytes} bytes of output; "
                            "stopped"
                        )
                    text = str(chunk.get("stream") or chunk.get("status") or "")
                    if "error" in chunk or "errorDetail" in chunk:
                        detail = chunk.get("errorDetail") or {}
                        error = str(detail.get("message") or chunk.get("error") or "")
                        text = error + "\n"
                    if text:
                        tail.append(text)
            except BuildRefused:
                raise
            except Exception as exc:
                if not (expired.is_set() or halted.is_set()):
                    raise SandboxError(f"{action} failed: {exc}") from None
            if halted.is_set():
                raise Halted(f"the job was halted during {action}; the build was stopped")
            if expired.is_set():
                raise BuildRefused(f"the build took longer than {timeout_seconds:g} s; stopped")
        finally:
            finished.set()
            timer.cancel()
            stream.close()
            if response is not None:
                response.close()
        if error is not None:
            raise SandboxError(f"{action} failed: {error}\n{''.join(tail)[-2000:]}")

    # -- containers -----------------------------------------------------------------------

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Mapping[str, str],
        stdin: bytes = b"",
        halt: threading.Event | None = None,
    ) -> RunResult:
        """One case container, to its end or its wall deadline (see Sandbox.run).

        ``halt`` (the job's: set when it is cancelled or its lease is lost, before the
        heartbeat removes the gate's containers) is read before the container is created and
        again once it exists, before it starts: a container created after the removal pass
        is removed here instead of running to completion. Set while the container runs, it
        is removed within HALT_POLL_SECONDS. Each raises Halted.
        """
        if halt is not None and halt.is_set():
            raise Halted("the job was halted; no case container was created")
        kwargs: dict[str, Any] = {
            "command": list(argv),
            # The runner starts as root with only what it needs to run each invocation under
            # INVOCATION_UID (which then holds no capability) and to kill what it leaves.
            "user": "0:0",
            "cap_drop": ["ALL"],
            "cap_add": ["SETUID", "SETGID", "KILL"],
            "security_opt": ["no-new-privileges"],
            "init": True,  # reaps the orphans that invocations leave and the runner kills
            "ulimits": [
                Ulimit(name="nofile", soft=1024, hard=1024),
                Ulimit(name="core", soft=0, hard=0),
                Ulimit(name="fsize", soft=limits.tmpfs_mb * MIB, hard=limits.tmpfs_mb * MIB),
            ],
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={limits.tmpfs_mb}m,mode=1777"},
            "pids_limit": limits.pids,
            "mem_limit": f"{limits.memory_mb}m",
            "memswap_limit": f"{limits.memory_mb}m",
            "nano_cpus": int(limits.cpus * 1e9),
            "network_mode": limits.network,
            # With no network the engine need not join one: NetworkDisabled gives the
            # container a fresh namespace with only loopback, as "none" does, but skips
            # libnetwork's sandbox and the prestart hook that re-executes dockerd once per
            # container, which was half the CPU of a case container's start (Docker 20.10).
            "network_disabled": limits.network == "none",
            "labels": {LABEL: "case", **labels},
            # No environment of ours: the image's alone reaches the runner's process. What a
            # case needs (its environment, the nonce) goes to the runner's stdin, read once.
            # With stdin_open the SDK also sets StdinOnce (it creates attached containers):
            # the engine closes the container's stdin when our attach ends, an end of file.
            "stdin_open": True,
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
            if halt is not None and halt.is_set():
                raise Halted("the job was halted; the case container was removed unstarted")
            with _docker_errors("starting a case container"):
                # Attached before the start, so nothing the runner reads can be missed.
                handoff = container.attach_socket(params={"stdin": 1, "stream": 1})
                try:
                    container.start()
                    start_ms = int((time.monotonic() - started) * 1000)
                    _send_and_close(handoff, stdin, limits.wall_seconds)
                finally:
                    handoff.close()
            timed_out, exit_code = self._wait(container, limits.wall_seconds, halt)
            duration_ms = int((time.monotonic() - started) * 1000)
            with _docker_errors("reading a case container's output"):
                container.reload()
                oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
                stdout = container.logs(stdout=True, stderr=False)
                stderr = container.logs(stdout=False, stderr=True, tail=200)
            if not timed_out and not oom and exit_code in STOPPED_FROM_OUTSIDE:
                raise SandboxError(
                    f"the case container was stopped from outside (exit code {exit_code}): the "
                    "Docker engine restarted or stopped, or someone stopped the container; "
                    "the case was not judged"
                )
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
            start_ms=start_ms,
        )

    @staticmethod
    def _wait(
        container: Any, wall_seconds: float, halt: threading.Event | None = None
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
                        container.remove(force=True)
                    except _DOCKER_ERRORS as exc:
                        log.debug("removing a halted case container: %s", exc)
                    return

        if halt is not None:
            threading.Thread(target=watch_halt, name="gate-case-halt", daemon=True).start()
        try:
            status = container.wait(timeout=wall_seconds)
            if halt is not None and halt.is_set():
                raise Halted("the job was halted; its case container was removed")
            return False, int(status.get("StatusCode", -1))
        except requests.exceptions.ReadTimeout as exc:
            if time.monotonic() - started < wall_seconds - 1:
                raise SandboxError(
                    f"waiting for a case container failed early: {exc}; the case was not judged"
                ) from None
        except _DOCKER_ERRORS as exc:
            if halt is not None and halt.is_set():
                raise Halted("the job was halted; its case container was removed") from None
            raise SandboxError(
                f"lost the Docker engine while a case container ran ({exc}); "
                "the case was not judged"
            ) from None
        finally:
            finished.set()
        with _docker_errors("stopping a timed-out case container"):
            container.kill()
        return True, None

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
            # ignore_removed: a container removed between the listing and its inspection (its
            # own run() ending, another reaper) is gone already, not an engine failure.
            for container in self.client.containers.list(
                all=True, filters=filters, ignore_removed=True
            ):
                if keep is not None and keep(container.labels or {}):
                    continue
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    continue  # gone already (its own run() removed it)
                except docker.errors.APIError as exc:
                    if exc.status_code == 409:
                        continue  # "removal already in progress": someone else's removal
                    raise
                removed += 1
        return removed

    # -- garbage collection ---------------------------------------------------------------

    def list_images(self) -> list[ImageInfo]:
        """Every image with its own bytes and container count (the engine's disk usage)."""
        with _docker_errors("listing images"):
            usage = self.client.df()
        images: list[ImageInfo] = []
        for item in usage.get("Images") or []:
            size = int(item.get("Size") or 0)
            shared = int(item.get("SharedSize") or 0)
            images.append(
                ImageInfo(
                    id=str(item.get("Id") or ""),
                    tags=tuple(t for t in item.get("RepoTags") or () if t != "<none>:<none>"),
                    labels=dict(item.get("Labels") or {}),
                    created=float(item.get("Created") or 0),
                    unique_bytes=max(0, size - max(0, shared)),
                    parent_id=str(item.get("ParentId") or ""),
                    containers=max(0, int(item.get("Containers") or 0)),
                )
            )
        return images

    def remove_image(self, ref: str) -> bool:
        try:
            # Never forced: the engine refuses while a container (running or not) uses it.
            self.client.images.remove(ref, force=False, noprune=False)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # conflict: in use by a container
                log.info("image %s is in use; kept (%s)", ref, exc.explanation)
                return False
            raise SandboxError(f"removing image {ref} failed: {exc}") from None
        except _DOCKER_ERRORS as exc:
            raise SandboxError(f"removing image {ref} failed: {exc}") from None
        return True

    def close(self) -> None:
        self.client.close()


def _send_and_close(attached: Any, data: bytes, timeout_s: float) -> None:
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

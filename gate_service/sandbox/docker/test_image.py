"""Test images: one per bundle, built FROM the runner image within a time limit and an output
cap, cut when the job halts, and rid of whatever else the build made (its leftovers)."""

from __future__ import annotations

import json
import logging
import socket
import tarfile
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from docker.types import LogConfig, Ulimit
from docker.utils import parse_repository_tag

from ...config import gvisor_host_tasks
from ..port import (
    BUILD_DEADLINE_LABEL,
    BUILD_ID_LABEL,
    LABEL,
    BuildRefused,
    Halted,
    SandboxError,
    TestImageSpec,
)
from .engine import DOCKER_ERRORS, HALT_POLL_SECONDS, docker_errors, read_logs, task_ulimits
from .recipes import (
    STEP_LOG_BYTES,
    STEP_MEMORY_MB,
    STEP_PIDS,
    build_labels,
    commit_changes,
    compile_and_plan_command,
    deps_dockerfile,
)
from .runner_image import RunnerImages
from .wire import read_timed_out

log = logging.getLogger(__name__)

# How much longer than the build's time limit its step container's deadline label says: the
# orphan reaper must never take the step of a build that is still within its limit.
STEP_DEADLINE_MARGIN_SECONDS = 60.0
# A cut or failed test-image build: how long to wait, at most, for the engine to remove its
# last step's container, and the time between two looks (see DockerImageBuilder._settle_build).
BUILD_SETTLE_SECONDS = 30.0
SETTLE_LOOK_SECONDS = 0.5


def _build_response(stream: Any) -> Any:
    """The HTTP response behind the generator that docker-py's ``api.build`` returns.

    ``api.build`` posts the request itself and returns ``_stream_helper(response, ...)``, a
    generator not yet started, whose frame holds the response: the only handle from which a
    build that is blocked reading a silent step can be cut off.
    """
    frame = getattr(stream, "gi_frame", None)
    return None if frame is None else frame.f_locals.get("response")


class DockerImageBuilder(RunnerImages):
    """The port's ImageBuilder on Docker: the runner image, test images, their inventory."""

    def build_test_image(self, spec: TestImageSpec, *, halt: threading.Event | None = None) -> str:
        """Build the bundle's test image; whatever else the build made is removed as it ends."""
        build_id = uuid.uuid4().hex
        if not spec.requirements:
            return self._build_in_container(spec, build_id, halt)
        dockerfile = deps_dockerfile(
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

    def _build_in_container(
        self, spec: TestImageSpec, build_id: str, halt: threading.Event | None
    ) -> str:
        """A bundle without requirements: one step container, committed (recipes.commit_changes).

        The bundle goes in as a root-owned archive, the step compiles it and writes the plan,
        and the stopped container is committed as the test image, then removed. Within the
        build's time limit, cut when ``halt`` is set; nothing but the test image remains.
        """
        action = f"building test image {spec.tag}"
        if halt is not None and halt.is_set():
            raise Halted(f"the job was halted before {action}")
        limit = self.settings.build_timeout_seconds
        deadline = time.monotonic() + limit
        runner = self.runner_image()
        archive = spec.context_dir / "bundle.tar"
        _root_owned_tar(spec.context_dir / "bundle", archive)
        api = self.client.api
        labels = {
            **build_labels(spec, build_id),
            BUILD_DEADLINE_LABEL: str(int(time.time() + limit + STEP_DEADLINE_MARGIN_SECONDS)),
        }
        # Under gVisor the step's tasks are held as a case's are (Settings.case_host_pids):
        # in gVisor's kernel by RLIMIT_NPROC, and its host pids sized for what they cost.
        guest = self.settings.case_guest_tasks(self.runtime)
        host = api.create_host_config(
            # The step runs the bundle's code (its compile and plan): under the cases' runtime.
            runtime=self.settings.case_runtime,
            network_mode="none",
            cap_drop=["ALL"],
            cap_add=["SETUID", "SETGID"],  # the plan's drop to the invocation uid
            security_opt=["no-new-privileges"],
            pids_limit=STEP_PIDS if guest is None else gvisor_host_tasks(guest),
            mem_limit=f"{STEP_MEMORY_MB}m",
            memswap_limit=f"{STEP_MEMORY_MB}m",
            ulimits=[
                Ulimit(name="nofile", soft=1024, hard=1024),
                Ulimit(name="core", soft=0, hard=0),
                *task_ulimits(guest),
            ],
            log_config=LogConfig(
                type="json-file", config={"max-size": str(STEP_LOG_BYTES), "max-file": "1"}
            ),
        )
        with docker_errors(action):
            entrypoint = self.client.images.get(runner).attrs["Config"]["Entrypoint"]
            step = str(
                api.create_container(
                    runner,
                    entrypoint=compile_and_plan_command(),
                    user="0:0",
                    network_disabled=True,
                    labels=labels,
                    host_config=host,
                )["Id"]
            )
        try:
            with docker_errors(action), archive.open("rb") as data:
                api.put_archive(step, "/", data)
                api.start(step)
            self._wait_for_step(step, action, deadline, limit, halt)
            repository, tag = parse_repository_tag(spec.tag)
            with docker_errors(action):
                api.commit(
                    step,
                    repository=repository,
                    tag=tag,
                    changes=commit_changes(entrypoint, {LABEL: "test", **spec.labels}),
                    pause=False,  # it has exited
                )
        finally:
            try:
                api.remove_container(step, force=True)
            except DOCKER_ERRORS as exc:  # the orphan reaper's, by its deadline label
                log.warning("could not remove build step %s of %s: %s", step, spec.tag, exc)
        return spec.tag

    def _wait_for_step(
        self,
        step: str,
        action: str,
        deadline: float,
        limit: float,
        halt: threading.Event | None,
    ) -> None:
        """Wait for the build step to exit 0; past ``deadline``, or once ``halt`` is set, raise
        (the caller removes the step). Waits are short, so a halt is seen within one."""
        api = self.client.api
        while True:
            if halt is not None and halt.is_set():
                raise Halted(f"the job was halted during {action}; the build was stopped")
            left = max(0.01, deadline - time.monotonic())
            try:
                # requests takes a float timeout; the stub's int is narrower than docker-py.
                wait = min(HALT_POLL_SECONDS, left)
                status = api.wait(step, timeout=wait)  # type: ignore[arg-type]
                break
            except DOCKER_ERRORS as exc:
                if not read_timed_out(exc):
                    raise SandboxError(f"{action} failed: {exc}") from None
            if deadline - time.monotonic() <= 0:
                # A busy engine may answer a wait late: the step's own state decides.
                with docker_errors(action):
                    state = api.inspect_container(step).get("State") or {}
                if state.get("Status") != "exited":
                    raise BuildRefused(f"the build took longer than {limit:g} s; stopped")
                status = {"StatusCode": state.get("ExitCode", -1)}
                break
        code = int(status.get("StatusCode", -1))
        if code == 0:
            return
        # The step catches every error of its own, so only a kill ends it otherwise.
        with docker_errors(action):
            oom = bool(api.inspect_container(step).get("State", {}).get("OOMKilled"))
            said = read_logs(api, step, stdout=True, stderr=True, tail=20).decode(errors="replace")
        if oom:
            raise BuildRefused(
                f"compiling the bundle and planning its cases took more than {STEP_MEMORY_MB} "
                "MiB of memory; stopped"
            )
        raise SandboxError(f"{action} failed: its step exited with code {code}\n{said[-2000:]}")

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
                with docker_errors("listing a build's containers"):
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
            with docker_errors("listing a build's images"):
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
        with docker_errors(action):
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


def _root_owned_tar(bundle: Path, dest: Path) -> None:
    """Write ``bundle``'s contents to ``dest`` as an archive that unpacks under /bundle, every
    entry owned by root (as COPY --chown=0:0 gives them). The entries are the bundle's
    children, not the directory itself, so /bundle keeps the runner image's owner and mode."""

    def root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        # The bundle's reader writes plain files and directories only (bundles/archive.py);
        # anything else here is a bug, never to be copied in for a root step to write through.
        if not (info.isfile() or info.isdir()):
            raise SandboxError(f"the bundle holds {info.name}, neither a file nor a directory")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode &= 0o777  # no setuid, setgid or sticky bit
        return info

    with tarfile.open(dest, "w") as tar:
        for child in sorted(bundle.iterdir()):
            tar.add(child, arcname=f"bundle/{child.name}", filter=root_owned)

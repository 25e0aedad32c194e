"""Test images: one per bundle, built FROM the runner image within a time limit and an output
cap, cut when the job halts, and rid of whatever else the build made (its leftovers)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections import deque
from typing import Any

from ..port import BUILD_ID_LABEL, LABEL, BuildRefused, Halted, SandboxError, TestImageSpec
from .engine import HALT_POLL_SECONDS, docker_errors
from .recipes import build_labels, bundle_dockerfile
from .runner_image import RunnerImages

log = logging.getLogger(__name__)

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
            # A one-stage build that finished made nothing but the test image's own steps,
            # which go with it: no listing of the engine's images (a third of a second on an
            # engine holding a few hundred) for leftovers that cannot exist.
            if not finished or spec.requirements:
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

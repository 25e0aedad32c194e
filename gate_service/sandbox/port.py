"""The sandbox port: what the worker asks of a container engine, whatever the engine is.

Two protocols, because building images and running cases are separate jobs that a backend
may do with separate machinery (a Kubernetes backend would build with kaniko and push to a
registry, and run each case as a Job): ``ImageBuilder`` makes the runner image and one test
image per bundle and keeps the inventory garbage collection reads; ``CaseRunner`` runs one
hardened container per case and removes leftovers by label. ``Sandbox`` is both, as one
backend object serves a worker. The port also declares the values that cross it and its own
errors. What a case may reach is said in the port's own terms, never an engine's: its
``ModelChannel`` (the gateway's end of the case's one way out, which each backend delivers
into the case its own way) and the ``NetworkPolicy`` of its ``RunLimits`` (no network, or a
network the operator named). It imports no engine library: gate_service.sandbox.factory
picks the backend (GATE_SANDBOX_BACKEND), and tests/contract/test_sandbox_port.py is what
every backend must pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Where a test image holds the bundle's dependencies: root-owned, outside the runner's venv,
# and put on sys.path after the runner's own paths (the runner owns that name), so no wheel
# can replace runner modules or add a .pth startup hook to the runner's interpreter.
from gate_runner import BUNDLE_DEPS_DIR as BUNDLE_DEPS_DIR
from gate_runner import gateway_wire

from ..errors import GateError

LABEL = "gate.managed"  # every container and image we create carries it, for the reaper
# Every image a test-image build makes besides the test image (the dependency stage, every
# intermediate step) carries LABEL=BUILD_STAGE, the bundle's gate.bundle, the tag it was
# building (BUILD_IMAGE_LABEL) and that one build's id (BUILD_ID_LABEL): the build removes
# its own by the id when it ends, and garbage collection finds what a crashed one left.
BUILD_STAGE = "build"
BUILD_ID_LABEL = "gate.build"
BUILD_IMAGE_LABEL = "gate.image"
# A build's own step container (a one-stage test image is built in one; see the Docker
# backend's recipes) carries the wall-clock time, in epoch seconds, by which its build has
# ended one way or the other. One still there later was left by a worker that died during
# the build, and the orphan reaper removes it (build_step_expired). The test image committed
# from it keeps its labels, and case containers inherit them, but only a container labelled
# LABEL=BUILD_STAGE is ever taken for a step (cases are LABEL=case, the image LABEL=test).
BUILD_DEADLINE_LABEL = "gate.build_deadline"
# The runner starts as root with only SETUID, SETGID and KILL, and runs every invocation
# (all user code) under this uid, which holds no capability at all.
INVOCATION_UID = 10001
SCRATCH_DIR = "/tmp"  # the case's only writable place, a size-capped tmpfs


def build_step_expired(labels: Mapping[str, str], now: float) -> bool:
    """Whether a container is a build step whose build should have ended by ``now``."""
    if labels.get(LABEL) != BUILD_STAGE:
        return False
    try:
        return float(labels.get(BUILD_DEADLINE_LABEL, "")) < now
    except ValueError:
        return False  # another builder's step (the classic builder's carry no deadline)


def network_refusal(name: str) -> str | None:
    """Why ``name`` cannot name a case's network, or None when it can."""
    if not name or name != name.strip():
        return "it is blank or has spaces around it"
    if name == "none":
        return "'none' is no network at all: NetworkPolicy() says that"
    if name == "host" or name.startswith("container:"):
        # Engine modes that share a namespace rather than name a network: the case would
        # reach all that the host, or that container, reaches.
        return "it shares the host's or another container's network instead of naming one"
    return None


@dataclass(frozen=True)
class NetworkPolicy:
    """Where a case container's own connections may go (design.md: no network unless the
    deployment configures one), whatever the backend calls a network.

    ``NetworkPolicy()`` (``NO_NETWORK``, the default): nowhere. The case has loopback alone,
    and its model channel is its one way out. ``NetworkPolicy.named(name)``: onto the network
    the operator made and named (GATE_CASE_NETWORK), which the backend joins its own way (a
    Docker network; a Kubernetes backend would label the Pod for the operator's
    NetworkPolicy). Never the host's network or another container's: ``named`` refuses those.
    """

    name: str | None = None  # None: no network

    def __post_init__(self) -> None:
        why = None if self.name is None else network_refusal(self.name)
        if why:
            raise ValueError(f"{self.name!r} cannot be a case's network: {why}")

    @classmethod
    def named(cls, name: str) -> NetworkPolicy:
        return cls(name)

    @classmethod
    def from_setting(cls, value: str) -> NetworkPolicy:
        """GATE_CASE_NETWORK's policy: ``none`` (or nothing) is no network, any other value
        names the operator's network."""
        value = value.strip()
        return cls() if value in ("", "none") else cls(value)

    @property
    def isolated(self) -> bool:
        """No network at all: only loopback in the case."""
        return self.name is None

    def __str__(self) -> str:
        return "none" if self.name is None else self.name


NO_NETWORK = NetworkPolicy()


@dataclass(frozen=True)
class ModelChannel:
    """A case's channel to the model gateway (gate_service.gateway), as the gateway serves it:
    the endpoint a backend delivers into that case alone, its own way, so that the runner
    inside finds a Unix socket at gateway_wire.SOCKET_PATH and nothing else of the worker.

    The gateway's end is a Unix socket on the worker's host, ``socket``, alone in a folder of
    its own (``folder``, which holds nothing else and is known to the worker alone). The
    folder exists when the case's container is created; the socket may come later, before
    the start, and is gone when the case has ended. A backend whose cases run on the worker's
    host bind-mounts the folder read-only at gateway_wire.SOCKET_DIR (the Docker backend); one
    whose cases run elsewhere (another node) would carry the socket's connections to the case
    itself, as a proxy that listens at SOCKET_PATH beside the case and forwards each one here.
    Either way the case sees a socket to connect to, not the worker's host or network, and
    the token handed to its runner on stdin is the credential.
    """

    socket: Path

    @classmethod
    def in_folder(cls, folder: Path) -> ModelChannel:
        """The channel whose socket the gateway makes in ``folder`` (ModelGateway.case_folder)."""
        return cls(folder / gateway_wire.SOCKET_NAME)

    @property
    def folder(self) -> Path:
        return self.socket.parent


@dataclass(frozen=True)
class RunLimits:
    memory_mb: int
    cpus: float
    pids: int
    wall_seconds: float
    tmpfs_mb: int
    output_limit_bytes: int
    network: NetworkPolicy = NO_NETWORK
    # Tasks (processes and threads) the case's code may have at once, held by the kernel the
    # case runs on (RLIMIT_NPROC), where that kernel is the case's own (gVisor); None: only
    # ``pids`` holds them.
    guest_tasks: int | None = None


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    duration_ms: int
    timed_out: bool
    oom_killed: bool
    output_truncated: bool
    # Milliseconds from asking the engine for the container until it was running.
    start_ms: int | None = None


@dataclass(frozen=True)
class TestImageSpec:
    """What goes into a bundle's test image."""

    tag: str
    context_dir: Path  # holds bundle/ and, when there are requirements, wheels/
    # Canonical PEP 508 strings (gate_service.bundles.requirements), installed from wheels/
    # into BUNDLE_DEPS_DIR; never a requirements file.
    requirements: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageInfo:
    """One image on the engine, as garbage collection sees it."""

    id: str
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    created: float  # Unix time
    # Bytes of the image's own layers (shared with no other image): what removing it frees.
    unique_bytes: int
    parent_id: str = ""  # the image it was built on ("" when the engine does not say)
    containers: int = 0  # containers (running or not) made from it


class SandboxError(GateError):
    """The engine failed underneath us: an infrastructure error, never the bundle's fault."""

    status_code = 502


class SandboxSettingError(ValueError):
    """A sandbox setting no backend can act on (a backend, network or runtime it does not
    have): the worker stops at start-up, saying why."""


class BuildRefused(Exception):
    """A test image build went past its time limit or output cap.

    Not a SandboxError: the build steps are ours and fixed, so what makes one slow or loud is
    the bundle (its files, its wheels); a retry would hit the same limit.
    """


class Halted(SandboxError):
    """The job's halt event was set (the gate was cancelled, or the job's lease was lost) while
    the engine worked for it: the download, build or case container was stopped and nothing
    was judged. A SandboxError, so a halted case is skipped like one whose container the
    heartbeat removed; the handler reads the halt itself and never retries for it.
    """


class ImageBuilder(Protocol):
    """The images cases run from: the runner image, a test image per bundle, and their
    inventory for garbage collection (gate_service.worker.gc uses only this side)."""

    def runner_image(self) -> str:
        """Make sure the runner base image exists (building it if needed); return its tag."""
        ...

    def image_exists(self, tag: str) -> bool: ...

    def build_test_image(self, spec: TestImageSpec, *, halt: threading.Event | None = None) -> str:
        """Build ``spec.tag`` from the runner image and ``spec.context_dir``; return the tag.

        ``halt``: the job's halt event (ClaimedJob.halt). Set before or during the
        build, the build stops, nothing is tagged, and Halted is raised.
        """
        ...

    def list_images(self) -> list[ImageInfo]:
        """Every image on the engine, untagged ones included (they link children to parents)."""
        ...

    def remove_image(self, ref: str) -> bool:
        """Remove an image reference, never by force; False when it is gone or still in use."""
        ...


class CaseContainer(Protocol):
    """A case container that ``CaseRunner.create`` made and has not started: run once, then
    removed, whether it ran or not."""

    def run(
        self, stdin: bytes, *, wall_seconds: float, halt: threading.Event | None = None
    ) -> RunResult:
        """Start it, hand ``stdin`` to the runner, and wait for its end or ``wall_seconds``
        (as ``CaseRunner.run``, which see). ``halt`` set before the start: it is not started,
        and Halted is raised; set while it runs, it is stopped and Halted raised."""
        ...

    def remove(self) -> None:
        """Remove it, started or not; returns once the engine no longer has it."""
        ...


class CaseRunner(Protocol):
    """One hardened container per case, and the removal of those no worker judges any more."""

    @property
    def runtime(self) -> str:
        """The OCI runtime its case containers run under (runc, runsc), as the gate's JSON
        and page report it: GATE_CASE_RUNTIME, or the engine's default."""
        ...

    def create(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Mapping[str, str],
        halt: threading.Event | None = None,
        model_channel: ModelChannel | None = None,
    ) -> CaseContainer:
        """A case container as ``run`` makes one, created and not started.

        So a worker makes a case's container while the case still waits for a CPU slot, and
        removes it after giving the slot back: only the start, the run and the reading of its
        output hold one. ``limits.wall_seconds`` is not read here (``CaseContainer.run``
        takes it), and ``model_channel``'s folder must exist: its socket may come later,
        before the start. ``halt`` set: none is created, and Halted is raised.
        """
        ...

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Mapping[str, str],
        stdin: bytes = b"",
        halt: threading.Event | None = None,
        model_channel: ModelChannel | None = None,
    ) -> RunResult:
        """One case container, to its end or ``limits.wall_seconds``.

        ``stdin``: what the runner reads on its standard input, then end of file (the case's
        environment and nonce, gate_runner/case_env.py). The container itself gets no
        environment from the worker: only its image's, so nothing a project controls
        reaches the runner's own process.

        ``model_channel``: this case's channel to the model gateway, delivered into this
        container alone so that its runner connects at gateway_wire.SOCKET_PATH (see
        ModelChannel); None: the case has none. ``limits.network`` is where else it may
        connect: with NO_NETWORK (the default) the channel is the case's one way out.

        The result's ``stderr`` is empty when the container exited 0 with stdout ending in
        the runner's result block: only a runner that broke has it read.

        ``halt``: the job's halt event. Set before the container exists, none is created;
        set while it runs, it is removed. Either raises Halted.
        """
        ...

    def reap(
        self,
        labels: Mapping[str, str],
        *,
        keep: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> int:
        """Remove our containers carrying these labels (except those ``keep`` spares).

        A case whose container is removed while it runs ends its ``run`` with SandboxError.
        Returns how many were removed.
        """
        ...


class Sandbox(ImageBuilder, CaseRunner, Protocol):
    """A backend as a worker holds it: both sides, over one connection to the engine."""

    def close(self) -> None:
        """Release the connection to the engine."""
        ...

"""The typed port to the container engine. Only this package imports `docker`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

LABEL = "gate.managed"  # every container and image we create carries it, for the reaper


@dataclass(frozen=True)
class RunLimits:
    memory_mb: int
    cpus: float
    pids: int
    wall_seconds: float
    tmpfs_mb: int
    output_limit_bytes: int
    network: str = "none"


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    duration_ms: int
    timed_out: bool
    oom_killed: bool
    output_truncated: bool


@dataclass(frozen=True)
class TestImageSpec:
    """What goes into a bundle's test image."""

    tag: str
    context_dir: Path  # holds bundle/ and, when with_wheels, wheels/
    with_wheels: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)


class Sandbox(Protocol):
    def runner_image(self) -> str:
        """Make sure the runner base image exists (building it if needed); return its tag."""
        ...

    def image_exists(self, tag: str) -> bool: ...

    def download_wheels(self, requirements: Path, dest: Path) -> None:
        """Fetch the wheels a requirements file names into ``dest`` on the host."""
        ...

    def build_test_image(self, spec: TestImageSpec) -> str: ...

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        limits: RunLimits,
        labels: Mapping[str, str],
        env: Mapping[str, str] | None = None,
    ) -> RunResult: ...

    def reap(
        self,
        labels: Mapping[str, str],
        *,
        keep: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> int:
        """Remove our containers carrying these labels (except those ``keep`` spares)."""
        ...

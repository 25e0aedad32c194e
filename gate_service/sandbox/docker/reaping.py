"""Reaping: removing our case containers by label, except those the caller keeps, while
other reapers and the containers' own runs may be removing the same ones."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import docker.errors

from ..port import LABEL
from .engine import DockerEngine, docker_errors


class ContainerReaper(DockerEngine):
    """Removes leftover case containers (CaseRunner.reap)."""

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
        with docker_errors("removing containers"):
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

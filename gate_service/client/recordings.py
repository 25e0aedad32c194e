"""`gate recordings`: write a gate's exported model calls as a project's replay files.

The answer of ``GET /v1/gates/{id}/recordings`` names each file by a path relative to the
project (``tests/recordings/<agent>/<key[:24]>.json``). It comes over the network, so a
path is written only when it stays inside the folder it is written to: no absolute path,
no ``..``, and none that a symbolic link already in the folder leads elsewhere.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any


class RecordingRefused(Exception):
    """A recording's path would land outside the output folder, or it is not a recording."""


def _target(out: Path, path: Any) -> Path:
    if not isinstance(path, str) or not path or "\\" in path or "\x00" in path:
        raise RecordingRefused(f"refusing the recording path {path!r}: not a plain path")
    relative = PurePosixPath(path)
    if relative.is_absolute() or any(part in ("", ".", "..") for part in relative.parts):
        raise RecordingRefused(f"refusing the recording path {path!r}: it leaves {out}")
    target = out.joinpath(*relative.parts)
    if not target.resolve().is_relative_to(out.resolve()):
        raise RecordingRefused(f"refusing the recording path {path!r}: it leaves {out}")
    return target


def write_recordings(answer: dict[str, Any], out: Path) -> Counter[str]:
    """Write every recording of ``answer`` under ``out``; the number of files per agent.

    Every path is checked before the first file is written, so a refused answer leaves the
    folder as it was.
    """
    items = answer.get("recordings") or []
    targets = []
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, dict) or not isinstance(content.get("key"), str):
            raise RecordingRefused(f"refusing {item!r:.200}: not a recording")
        targets.append((_target(out, item.get("path")), content))
    per_agent: Counter[str] = Counter()
    for target, content in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Checked again once its folders exist: a link made meanwhile must not lead out.
        if not target.resolve().is_relative_to(out.resolve()):
            raise RecordingRefused(f"refusing {target}: it leaves {out}")
        target.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        per_agent[target.parent.name] += 1
    return per_agent

"""Builders (spec §8.1): `tests/builders/<name>.py` with `build(context, builder_args,
test_name, payload, files) -> str | dict` and an optional `cleanup(run, context,
builder_args) -> bool | None`.

Decided (spec §13.15): both run once per invocation, each invocation with a fresh import
and a fresh `context`; a `False` from cleanup fails that invocation, not the whole case.
"""

from __future__ import annotations

import base64
import importlib.util
import mimetypes
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from .runtime import as_payload, call_user_function
from .runtime_errors import AgentRunError


def load_builder(project: Path, name: str) -> ModuleType:
    module_name = name.removesuffix(".py")
    path = project / "tests" / "builders" / f"{module_name}.py"
    spec = importlib.util.spec_from_file_location(f"gate_builder_{module_name}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise AgentRunError(f"builder tests/builders/{module_name}.py does not exist")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "build", None)):
        raise AgentRunError(f"builder tests/builders/{module_name}.py must define build(...)")
    return module


def fixture_entries(project: Path, names: list[str]) -> list[dict[str, Any]]:
    """Each `files:` name as {data (base64), mime_type (from the extension), name}."""
    entries = []
    for name in names:
        path = project / "tests" / "files" / name
        if not path.is_file():
            raise AgentRunError(f"fixture tests/files/{name} does not exist")
        entries.append(
            {
                "data": base64.b64encode(path.read_bytes()).decode("ascii"),
                "mime_type": mimetypes.guess_type(name)[0] or "application/octet-stream",
                "name": name,
            }
        )
    return entries


def with_files(payload: dict[str, Any], files: list[dict[str, Any]]) -> dict[str, Any]:
    """Fixtures join any `files` the payload already has (spec §7.3: lists concatenate)."""
    if not files:
        return payload
    existing = payload.get("files")
    earlier: list[Any] = existing if isinstance(existing, list) else []
    return {**payload, "files": [*earlier, *files]}


def run_build(module: ModuleType, case: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """Call build() and turn its str or dict into the payload, which replaces `payload`."""
    result = call_user_function(
        module.build,
        context,
        case.get("builder_args") or {},
        case["name"],
        case.get("payload"),
        list(case.get("files") or []),
    )
    if isinstance(result, dict):
        return dict(result)
    if isinstance(result, str):
        return as_payload(result)
    raise AgentRunError(f"builder build() must return str or dict, got {type(result).__name__}")


def run_cleanup(
    module: ModuleType, case: dict[str, Any], context: dict[str, Any], run: dict[str, Any]
) -> str | None:
    """cleanup()'s verdict: None when it passes, else the reason the invocation fails."""
    cleanup = getattr(module, "cleanup", None)
    if cleanup is None:
        return None
    try:
        result = call_user_function(cleanup, run, context, case.get("builder_args") or {})
    except Exception as exc:
        return f"builder cleanup raised: {exc}\n{traceback.format_exc(limit=5)}"
    if result is None or result is True:
        return None
    if result is False:
        return "builder cleanup returned False"
    return f"builder cleanup must return bool or None, got {type(result).__name__}"

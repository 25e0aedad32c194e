"""Gate labels: a small JSON object from the client, stored as JSONB and filtered on.

Everything a client sends here is checked before json.loads or Postgres see it: nesting is
bounded (a deep array is a RecursionError in the parser), text must be storable (no NUL, no
lone UTF-16 surrogate such as "\\ud800"), and numbers must be finite.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import BadRequest
from ..text import unstorable

MAX_LABELS_BYTES = 16 * 1024
MAX_LABELS_DEPTH = 8
MAX_LABEL_FILTERS = 20
MAX_LABEL_FILTER_CHARS = 1024


def _deepest(raw: str, limit: int) -> int:
    """How deep arrays and objects nest in ``raw`` (JSON text); stops counting past ``limit``."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif ch in "]}":
            depth -= 1
    return deepest


def _check_text(value: Any, where: str) -> None:
    if isinstance(value, str):
        why = unstorable(value)
        if why:
            raise BadRequest(f"{where} holds {why}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"a key of {where}")
            _check_text(item, f"{where}.{key[:40]}" if unstorable(key) is None else where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_text(item, f"{where}[{index}]")


def _refuse_constant(name: str) -> Any:
    raise BadRequest(f"labels: {name} is not a JSON number; numbers must be finite")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise BadRequest(f"labels: {text[:40]} is too large for a JSON number stored as a label")
    return number


def parse_labels(raw: str | None) -> dict[str, Any]:
    """The labels form field as a dict; 400 in the error shape for anything else."""
    if not raw:
        return {}
    if len(raw.encode("utf-8", "surrogatepass")) > MAX_LABELS_BYTES:
        raise BadRequest(f"labels must be at most {MAX_LABELS_BYTES} bytes of JSON")
    if _deepest(raw, MAX_LABELS_DEPTH) > MAX_LABELS_DEPTH:
        raise BadRequest(f"labels must not nest more than {MAX_LABELS_DEPTH} levels deep")
    try:
        labels = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"labels must be a JSON object: {exc}") from None
    if not isinstance(labels, dict):
        raise BadRequest(f"labels must be a JSON object, got {type(labels).__name__}")
    _check_text(labels, "labels")
    return labels


def parse_label_filter(items: list[str]) -> dict[str, str]:
    """`?label=key=value` (repeatable) as a dict for a JSONB containment query."""
    if len(items) > MAX_LABEL_FILTERS:
        raise BadRequest(f"at most {MAX_LABEL_FILTERS} label filters per request")
    wanted: dict[str, str] = {}
    for item in items:
        if len(item) > MAX_LABEL_FILTER_CHARS:
            raise BadRequest(f"a label filter must be at most {MAX_LABEL_FILTER_CHARS} characters")
        why = unstorable(item)
        if why:
            raise BadRequest(f"label filter {item[:60]!r} holds {why}")
        key, sep, value = item.partition("=")
        if not sep:
            raise BadRequest(f"label filter {item[:60]!r} must look like key=value")
        wanted[key] = value
    return wanted

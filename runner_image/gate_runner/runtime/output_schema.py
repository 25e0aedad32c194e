"""An LLM agent's `output_schema`: the final answer must be JSON and match it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..runtime_errors import AgentRunError


def final_output(agent: Any, text: str) -> Any:
    schema = getattr(agent.config, "output_schema_dict", None)
    if not schema:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        raise AgentRunError(
            f"output_schema {agent.config.output_schema!r}: the model's answer is not JSON: "
            f"{text[:200]!r}"
        ) from None
    problem = schema_problem(value, schema)
    if problem:
        raise AgentRunError(f"output_schema {agent.config.output_schema!r}: {problem}")
    return value


def schema_problem(value: Any, schema: Mapping[str, Any], where: str = "output") -> str | None:
    """A small JSON Schema check: type, required, properties, items, enum."""
    types: dict[str, type | tuple[type, ...]] = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "null": type(None),
    }
    expected = schema.get("type")
    if isinstance(expected, str) and expected in types:
        ok = isinstance(value, types[expected])
        if expected in ("integer", "number") and isinstance(value, bool):
            ok = False
        if not ok:
            return f"{where} should be {expected}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} should be one of {schema['enum']}, got {value!r}"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                return f"{where} is missing required property {key!r}"
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and isinstance(sub, Mapping):
                problem = schema_problem(value[key], sub, f"{where}.{key}")
                if problem:
                    return problem
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            problem = schema_problem(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None

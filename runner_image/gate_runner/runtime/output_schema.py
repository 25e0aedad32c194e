"""An LLM agent's `output_schema`: sent to the model as OpenAI's `response_format` with each
request of its loop, and the final answer must be JSON valid for the whole schema (JSON
Schema, Draft 2020-12 unless the schema's `$schema` names another draft)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..runtime_errors import AgentRunError

# How many of a mismatch's errors the reason names, and how long it may be.
MAX_ERRORS = 3
MAX_PROBLEM_CHARS = 1000
_NAME = re.compile(r"[^A-Za-z0-9_-]")


def response_format(config: Any) -> dict[str, Any] | None:
    """The agent's output_schema as OpenAI's ``response_format`` (LiteLLM maps it for
    Anthropic, Gemini and the rest), or None when it has none. ``name`` is the schema's
    name as OpenAI takes it (``[A-Za-z0-9_-]``, 64 at most); ``strict`` only when the
    schema meets OpenAI's strict mode (an object at the root, every object closed, every
    property required), which refuses any other schema."""
    schema = getattr(config, "output_schema_dict", None)
    if not schema or not isinstance(schema, Mapping):
        return None
    name = _NAME.sub("_", str(getattr(config, "output_schema", None) or "output"))[:64]
    return {
        "type": "json_schema",
        "json_schema": {
            "name": name or "output",
            "schema": json.loads(json.dumps(schema, default=str)),
            "strict": schema.get("type") == "object" and _strict(schema),
        },
    }


def _strict(schema: Any) -> bool:
    """Whether OpenAI's strict mode takes this schema: each object's properties all
    required and no other property allowed, all the way down."""
    if isinstance(schema, list):
        return all(_strict(s) for s in schema)
    if not isinstance(schema, Mapping):
        return True
    kind = schema.get("type")
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
    if is_object or "properties" in schema:
        properties = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return False
        if not isinstance(properties, Mapping) or set(schema.get("required") or []) != set(
            properties
        ):
            return False
    return all(_strict(v) for k, v in schema.items() if k not in ("enum", "const", "default"))


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
    """Why ``value`` is not valid for the whole JSON Schema ``schema`` (jsonschema: Draft
    2020-12, or the draft its ``$schema`` names), or None. Names the first MAX_ERRORS
    errors, each with its path and the keyword that failed, in MAX_PROBLEM_CHARS at most."""
    import jsonschema  # only when an agent has an output_schema: it costs an import

    try:
        validator_class = jsonschema.validators.validator_for(
            schema, default=jsonschema.Draft202012Validator
        )
        validator_class.check_schema(dict(schema))
        errors = sorted(
            validator_class(dict(schema)).iter_errors(value),
            key=lambda e: (list(map(str, e.absolute_path)), e.validator or ""),
        )
    except jsonschema.SchemaError as exc:
        return _cap(f"the schema itself is not valid JSON Schema: {exc.message}")
    except Exception as exc:  # an unresolvable $ref, a remote one (never fetched), ...
        return _cap(f"the schema cannot be applied: {type(exc).__name__}: {exc}")
    if not errors:
        return None
    reasons = [
        f"{_path(where, e.absolute_path)}: {_short(e.message)} ({e.validator})"
        for e in errors[:MAX_ERRORS]
    ]
    more = len(errors) - MAX_ERRORS
    tail = f"; and {more} more error(s)" if more > 0 else ""
    return _cap("; ".join(reasons) + tail)


def _path(where: str, path: Any) -> str:
    text = where
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _short(message: str) -> str:
    return message if len(message) <= 240 else message[:240] + "…"


def _cap(problem: str) -> str:
    return problem if len(problem) <= MAX_PROBLEM_CHARS else problem[:MAX_PROBLEM_CHARS] + "…"

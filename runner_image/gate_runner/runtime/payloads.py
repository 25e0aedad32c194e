"""The shapes a payload takes on its way through a run: the payload dict an agent receives,
the content middleware sees, the message a model gets, and JSON-safe values for the result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def jsonable(value: Any) -> Any:
    """Make a value safe for the JSON result; what JSON cannot hold is shown by repr."""
    try:
        return json.loads(json.dumps(value, default=repr))
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def as_payload(value: Any) -> dict[str, Any]:
    """A case's payload as the agent receives it (spec 7.1, seed "Payload").

    A JSON object (or a builder's dict) as it is; any other payload string, JSON or not, as
    `{"message": <the string>}` (the seed: "otherwise the string is delivered as {message:
    payload}"); a value that is not a string, as `{"input": value}`.
    """
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            decoded = None
        return decoded if isinstance(decoded, dict) else {"message": value}
    return {"input": value}


def stage_input(value: Any) -> dict[str, Any]:
    """What a tool agent receives from an upstream stage (spec 7.5): a JSON object as it is,
    a decoded non-object as `{"input": value}`, and text that is not JSON under `input`."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return {"input": value}
        return decoded if isinstance(decoded, dict) else {"input": decoded}
    return {"input": value}


def user_content(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The middleware-facing message (spec §4.1, §7.4): text part, then one part per file."""
    files = payload.get("files") if isinstance(payload.get("files"), list) else []
    rest = {k: v for k, v in payload.items() if k != "files"}
    text = rest["message"] if set(rest) == {"message"} else json.dumps(rest, default=str)
    parts: list[dict[str, Any]] = [{"text": str(text)}]
    for f in files or []:
        if isinstance(f, Mapping):
            parts.append(
                {"data": f.get("data"), "mime_type": f.get("mime_type"), "name": f.get("name")}
            )
    return {"role": "user", "parts": parts}


def content_to_message(content: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI-style user message from middleware content parts."""
    parts = content.get("parts") or []
    texts = [str(p["text"]) for p in parts if isinstance(p, Mapping) and "text" in p]
    files = [p for p in parts if isinstance(p, Mapping) and "data" in p]
    if not files:
        return {"role": "user", "content": "\n".join(texts)}
    body: list[dict[str, Any]] = [{"type": "text", "text": t} for t in texts]
    for p in files:
        data = p["data"]
        if isinstance(data, bytes | bytearray):
            import base64

            data = base64.b64encode(bytes(data)).decode("ascii")
        body.append(
            {
                "type": "file",
                "file": {
                    "filename": p.get("name"),
                    "mime_type": p.get("mime_type"),
                    "file_data": data,
                },
            }
        )
    return {"role": "user", "content": body}

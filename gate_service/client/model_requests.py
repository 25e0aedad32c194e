"""How a model span's recorded request reads (issue 38): one summary line, and each message
as a role and its text, for the CLI's trace (render.py) and the results pages
(gate_service/ui/views.py), so both say the same. Like the rest of the client it imports
nothing of the service.

The request's shape is the runner's (runner_image/gate_runner/runtime/model_request.py):
``system_prompt``, ``messages`` (``messages_dropped`` counts the oldest left out), ``tools``,
``response_format``, and ``omitted`` when only counts were kept. It is span metadata, which a
bundle's code can shape as it likes, so every value is checked before it is read. Standard
library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def count(value: Any) -> int:
    """A count the request holds, or 0 when it holds none that is one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def as_text(value: Any) -> str:
    """Text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def format_kind(request: Mapping[str, Any]) -> str | None:
    """The response format's type (``json_schema``), or None when the request had none."""
    answer = request.get("response_format")
    if not isinstance(answer, Mapping):
        return None
    kind = answer.get("type")
    return as_text(kind) if kind is not None else "(no type)"


def request_summary(request: Mapping[str, Any]) -> str:
    """``request: 4 messages, 2 tools, response_format json_schema``: the messages after the
    system prompt, those not kept said, and a request kept as counts alone said so."""
    kept, dropped = len(_items(request.get("messages"))), count(request.get("messages_dropped"))
    omitted = request.get("omitted") is not None
    messages = _plural(kept + dropped, "message")
    if dropped and not omitted:
        messages += f" ({dropped} not kept)"
    tools = len(_items(request.get("tools"))) + count(request.get("tools_dropped"))
    parts = [messages, _plural(tools, "tool")]
    kind = format_kind(request)
    if kind is not None:
        parts.append(f"response_format {kind}")
    line = "request: " + ", ".join(parts)
    return line + " (content not kept)" if omitted else line


@dataclass(frozen=True)
class MessageText:
    role: str  # user, assistant, system, or `tool NAME` for a tool's result
    text: str  # its content as text, then one `→ name(arguments)` line per tool call


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI's content parts: text, and files by name
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, Mapping) and isinstance(part.get("file"), Mapping):
                parts.append(f"[file {as_text(part['file'].get('filename') or '')}]".strip())
            else:
                parts.append(as_text(part))
        return "\n".join(parts)
    return as_text(content)


def message_text(message: Any) -> MessageText:
    """One message of the request as a person reads it: its role and its text."""
    if not isinstance(message, Mapping):
        return MessageText("?", as_text(message))
    role = as_text(message.get("role") or "?")
    if role == "tool" and message.get("name"):
        role = f"tool {as_text(message['name'])}"
    lines = [_content_text(message.get("content"))]
    for call in _items(message.get("tool_calls")):
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            name, arguments = function.get("name"), function.get("arguments")
            lines.append(f"→ {as_text(name)}({as_text(arguments or '')})")
        else:
            lines.append(f"→ {as_text(call)}")
    return MessageText(role, "\n".join(line for line in lines if line))

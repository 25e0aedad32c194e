"""What a ``model_call`` span records of its request (issue 38): the system prompt, the
messages sent, the tools offered and the response format, so that a person can see why a
model did or did not call a tool.

The record is one JSON object::

    {"system_prompt": str | None,
     "messages": [...],            # the messages after the system prompt, as sent, oldest first
     "messages_dropped": int,      # only when the oldest were left out to fit
     "tools": [{"name", "description", "parameters"}, ...],
     "response_format": {...} | None}

It is bounded twice, deterministically, and is always valid JSON (it is built as values,
never cut as text):

- **a span**: at most MAX_REQUEST_BYTES of JSON. A string over MAX_STRING_CHARS keeps its
  head and ends in the contract's ``…[N bytes cut]``; past the cap the oldest messages go
  first (counted in ``messages_dropped``; the system prompt and the last message stay), then
  every string is cut shorter, then the tools keep their names only (``tool_schemas_dropped``),
  and a request whose structure alone is too large is recorded as counts with ``omitted``
  saying why.
- **an invocation**: its requests hold at most MAX_TRACE_REQUEST_BYTES together. Past it the
  oldest recorded request becomes those counts (``omitted`` says so): a later request of the
  same loop repeats its conversation anyway, and holds the turn the run ended on. (Those
  counts, about 250 bytes each, are not charged to the budget.)

A ``sensitive`` approval input's answer is recorded as ``[sensitive]``, as in its tool
span. Redaction is the worker's, like everything stored for a case (gate_service/secrets/redact.py).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..contract import cut_mark
from .tool_calls import SENSITIVE
from .trace import Span, Trace

# 64 KiB of JSON a span: a system prompt, the tools and a long conversation's last turns
# fit, and a run keeps its requests far under what it may store (GATE_MAX_STORED_RUN_BYTES,
# 1 MiB by default; an invocation's requests take at most an eighth of it), so its output
# and other spans are not what gets cut.
MAX_REQUEST_BYTES = 64 * 1024
# 128 KiB of requests an invocation: a case's results leave its container together, under
# the case output limit (32 MiB), for up to 100 runs (a suite's `runs`). 100 x 128 KiB is
# 12.5 MiB, so requests alone never push a case's result past that limit.
MAX_TRACE_REQUEST_BYTES = 128 * 1024
# A longer string keeps this head. The runner compacts any stored string over 16,384
# characters to 1 KiB (case.py's MAX_STORED_STRING_CHARS); this head and its cut mark stay
# under that, so a long message is cut here, once, and keeps far more than 1 KiB.
MAX_STRING_CHARS = 16_000
# When the request is still over its cap, every string is cut to each of these in turn.
SHORTER_STRING_CHARS = (4096, 1024, 256, 64)

_lock = threading.Lock()  # parallel children ask their models from several threads
_recorded: weakref.WeakKeyDictionary[Trace, list[tuple[Span, dict[str, Any], int]]] = (
    weakref.WeakKeyDictionary()
)


def json_size(value: Any) -> int:
    """Bytes of ``value``'s compact JSON text in UTF-8, as stored runs count them."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", "surrogatepass"))


def _plain(value: Any) -> Any:
    """A JSON copy of ``value`` (the loop appends to its messages after the call): what
    JSON cannot hold as text (``str``), NaN and the infinities as strings, as stored runs."""
    try:
        return json.loads(json.dumps(value, default=str), parse_constant=str)
    except (RecursionError, ValueError):
        return "…[not recorded: nests too deeply]"


def _cut(value: Any, chars: int) -> Any:
    """``value`` with each string over ``chars`` cut to its head and a cut mark."""
    if isinstance(value, str):
        if len(value) <= chars:
            return value
        cut = len(value[chars:].encode("utf-8", "surrogatepass"))
        return value[:chars] + cut_mark(cut)
    if isinstance(value, list):
        return [_cut(v, chars) for v in value]
    if isinstance(value, dict):
        return {k: _cut(v, chars) for k, v in value.items()}
    return value


def _tool(schema: Any) -> dict[str, Any]:
    """An OpenAI tool schema as recorded: its function's name, description and parameters."""
    function = schema.get("function") if isinstance(schema, Mapping) else None
    if not isinstance(function, Mapping):
        return {"name": None, "parameters": _plain(schema)}
    return {
        "name": _plain(function.get("name")),
        "description": _plain(function.get("description")),
        "parameters": _plain(function.get("parameters")),
    }


def _fitted(
    fixed: dict[str, Any], messages: Sequence[Any], chars: int, cap: int
) -> dict[str, Any] | None:
    """``fixed`` (strings cut to ``chars``) with the newest of ``messages`` that fit in
    ``cap``, or None when not even the last one does."""
    record: dict[str, Any] = dict(_cut(fixed, chars))
    room = cap - json_size({**record, "messages": [], "messages_dropped": len(messages)})
    if room < 0:
        return None
    kept: list[Any] = []
    for message in reversed(messages):
        shown = _cut(_plain(message), chars)
        size = json_size(shown) + (1 if kept else 0)  # and its comma
        if size > room:
            break
        kept.append(shown)
        room -= size
    if messages and not kept:
        return None
    record["messages"] = kept[::-1]
    if len(kept) < len(messages):
        record["messages_dropped"] = len(messages) - len(kept)
    return record


def _summary(record: Mapping[str, Any], why: str) -> dict[str, Any]:
    """A request as counts alone, ``omitted`` saying why its content is not here."""
    messages = record.get("messages")
    tools = record.get("tools")
    answer = record.get("response_format")
    return {
        "messages_dropped": (len(messages) if isinstance(messages, list) else 0)
        + int(record.get("messages_dropped") or 0),
        "tools_dropped": (len(tools) if isinstance(tools, list) else 0)
        + int(record.get("tools_dropped") or 0),
        "response_format": (
            {"type": _cut(answer.get("type"), 64)} if isinstance(answer, Mapping) else None
        ),
        "omitted": why,
    }


def request_record(
    messages: Sequence[Any],
    tools: Sequence[Any],
    response_format: Mapping[str, Any] | None,
    cap: int = MAX_REQUEST_BYTES,
) -> dict[str, Any]:
    """What the span records of one request, in at most ``cap`` bytes of JSON."""
    rest = list(messages)
    system = None
    if rest and isinstance(rest[0], Mapping) and rest[0].get("role") == "system":
        system = _plain(rest.pop(0).get("content"))
    fixed: dict[str, Any] = {
        "system_prompt": system,
        "tools": [_tool(t) for t in tools],
        "response_format": _plain(response_format) if response_format else None,
    }
    for chars in (MAX_STRING_CHARS, *SHORTER_STRING_CHARS):
        record = _fitted(fixed, rest, chars, cap)
        if record is not None:
            return _ordered(record)
    names = {
        **fixed,
        "tools": [{"name": t.get("name")} for t in fixed["tools"]],
        "tool_schemas_dropped": len(fixed["tools"]),
    }
    record = _fitted(names, rest, SHORTER_STRING_CHARS[-1], cap)
    if record is not None:
        return _ordered(record)
    full = {**fixed, "messages": rest}
    return _summary(full, f"the request's structure alone is over {cap} bytes of JSON")


def _ordered(record: dict[str, Any]) -> dict[str, Any]:
    """The record's keys in the documented order: system prompt, messages, tools, format."""
    order = ("system_prompt", "messages", "messages_dropped", "tools", "tool_schemas_dropped")
    return {
        **{k: record[k] for k in order if k in record},
        "response_format": record.get("response_format"),
    }


def sensitive_inputs(config: Any) -> frozenset[str]:
    """The agent's approval inputs marked ``sensitive`` (SDK ApprovalInput): their answers
    reach the model, and a recorded request holds ``[sensitive]`` instead, as their tool
    spans do (tool_calls.py)."""
    entries = getattr(getattr(config, "approval", None), "inputs", None) or []
    return frozenset(
        name
        for entry in entries
        for name, spec in entry.items()
        if getattr(spec, "sensitive", False)
    )


def _hidden(message: Any, sensitive: Collection[str]) -> Any:
    """``message`` with a sensitive input's answer replaced by ``[sensitive]``."""
    if (
        isinstance(message, Mapping)
        and message.get("role") == "tool"
        and message.get("name") in sensitive
    ):
        return {**message, "content": SENSITIVE}
    return message


def record_request(
    trace: Trace,
    span: Span,
    messages: Sequence[Any],
    tools: Sequence[Any],
    response_format: Mapping[str, Any] | None,
    sensitive: Collection[str] = (),
    budget: int = MAX_TRACE_REQUEST_BYTES,
) -> None:
    """Put the request in ``span``'s metadata (the answers to ``sensitive`` inputs hidden),
    keeping ``trace``'s requests within ``budget``: the oldest recorded ones become counts
    until the newest fits."""
    if sensitive:
        messages = [_hidden(m, sensitive) for m in messages]
    record = request_record(messages, tools, response_format, min(MAX_REQUEST_BYTES, budget))
    size = json_size(record)
    with _lock:
        held = _recorded.setdefault(trace, [])
        total = sum(n for _, _, n in held) + size
        while held and total > budget:
            old_span, old_record, old_size = held.pop(0)
            why = (
                f"the invocation keeps its latest model requests, {budget} bytes of JSON in "
                "all: a later model call of the same agent repeats this conversation"
            )
            old_span.metadata["request"] = _summary(old_record, why)
            total -= old_size
        held.append((span, record, size))
        span.metadata["request"] = record

"""Sessions and context compression of LLM agents (SDK SessionConfig, ContextCompressionConfig;
spec 2.2), as a gate runs them.

A session is kept in the invocation's Runtime, keyed by agent and by the configured key's
value (``context.x``, ``input.x``, or one shared session without a key): runs of a session
agent within one invocation (a trigger loop, a chain) continue its history, and no two
invocations share one, because each invocation is a process of its own. ``ttl`` cannot end
a session within one invocation, and a gate has no browser to keep.

Compression summarises the older messages of the conversation into one, keeping the last
``keep_recent_messages`` as they are: before a request when the previous one's prompt passed
``max_prompt_tokens``, or after a request the provider refused for the context window. The
summary is one request to the compression model (the agent's by default) through the same
model (the gateway in live mode, the recordings in replay, the script in scripted mode), and
a ``context_compression`` span says what was compressed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..models import Model
from .trace import Span, Trace, timed

if TYPE_CHECKING:
    from .port import RuntimePort

SUMMARY_PROMPT = (
    "Summarise the conversation below for the assistant that continues it: keep every fact, "
    "decision, tool result and open question it needs; leave out pleasantries. Answer with "
    "the summary only."
)
SUMMARY_PREFIX = "[Summary of the earlier conversation]"
# A provider's refusal for the context window, as LiteLLM names it (through the gateway its
# message keeps the exception's name) or as providers word it.
CONTEXT_WINDOW = re.compile(
    r"ContextWindowExceeded|context[ _-]?(window|length)|maximum context", re.IGNORECASE
)


# What of the older messages the summary request carries: each message's content cut to
# MAX_MESSAGE_CHARS, the whole to MAX_TRANSCRIPT_CHARS (its newest part), so that the repair
# request after a context-window refusal is not as large as the prompt it repairs.
MAX_MESSAGE_CHARS = 4_000
MAX_TRANSCRIPT_CHARS = 60_000


def transcript(messages: list[dict[str, Any]]) -> str:
    """The older messages as the summary request reads them: one JSON line each, cut."""
    lines = []
    for message in messages:
        shown = dict(message)
        content = shown.get("content")
        if isinstance(content, str) and len(content) > MAX_MESSAGE_CHARS:
            cut = len(content) - MAX_MESSAGE_CHARS
            shown["content"] = f"{content[:MAX_MESSAGE_CHARS]}…[{cut} characters cut]"
        lines.append(json.dumps(shown, default=str))
    text = "\n".join(lines)
    return text[-MAX_TRANSCRIPT_CHARS:]


def session_key(config: Any, context: Mapping[str, Any]) -> tuple[str, str] | None:
    """The session a run of this agent continues, or None: no session, ``history: false``,
    or a key whose value this run does not have."""
    session = getattr(config, "session", None)
    if session is None or session is False:
        return None
    if session is True:
        return (config.name, "")
    if not getattr(session, "history", True):
        return None
    path = getattr(session, "key", None)
    if not path:
        return (config.name, "")
    scope, _, rest = str(path).partition(".")
    source: Any = context.get("payload") if scope == "input" else context
    value = source
    for part in rest.split(".") if rest else []:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if value is None:
        return None
    return (config.name, json.dumps(value, sort_keys=True, default=str))


def compression_of(config: Any) -> Any:
    """The agent's context compression when it is enabled, else None."""
    compression = getattr(config, "context_compression", None)
    return compression if compression is not None and compression.enabled else None


def is_context_window_error(exc: BaseException) -> bool:
    return CONTEXT_WINDOW.search(str(exc)) is not None


def compress(
    rt: RuntimePort,
    model: Model,
    config: Any,
    compression: Any,
    messages: list[dict[str, Any]],
    reason: str,
    context: dict[str, Any],
    trace: Trace,
    parent: Span,
) -> list[dict[str, Any]] | None:
    """``messages`` with the older ones summarised, or None when there is nothing older than
    the messages it keeps. The system message stays first; a kept part never starts with a
    tool result whose call it would lose."""
    body = messages[1:]
    cut = len(body) - max(1, int(compression.keep_recent_messages))
    while 0 < cut < len(body) and body[cut].get("role") == "tool":
        cut -= 1
    if cut <= 0:
        return None
    older, kept = body[:cut], body[cut:]
    name = compression.model or config.model or ""
    span = trace.open(
        "context_compression",
        name or "model",
        parent,
        reason=reason,
        model=name,
        compressed_messages=len(older),
        kept_messages=len(kept),
    )
    with timed(span):
        reply = model.complete(
            model=name,
            messages=[
                {"role": "system", "content": SUMMARY_PROMPT},
                {"role": "user", "content": transcript(older)},
            ],
            tools=[],
            temperature=0.0,
            context=context,
        )
    rt.count_tokens(context, reply.usage)
    summary = reply.content or ""
    span.metadata.update(reply.span_metadata, summary=summary)
    return [messages[0], {"role": "user", "content": f"{SUMMARY_PREFIX}\n{summary}"}, *kept]

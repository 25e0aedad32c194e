"""What the gateway records of each call, its totals, and its export as replay recordings.

A recording is the file gate_runner/models.py ``ReplayModel`` reads:
``<agent>/<key[:24]>.json`` holding ``{"key", "request", "response"}``, where ``key`` is
``request_key(request)`` and ``response`` is what ``parse_reply`` accepts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate_runner.gateway_wire import (
    ApiReply,
    CompletionReply,
    FetchReply,
    GatewayError,
    McpReply,
    ModerationReply,
)
from gate_runner.models import recording, write_recording

# An agent's name as a recording folder: one plain path component.
AGENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def safe_agent(name: str) -> bool:
    return AGENT_NAME.fullmatch(name) is not None and ".." not in name


# A call's status when its provider (or a page's host, an MCP server, an API) answered it;
# any other status is a GatewayError's kind: the call failed, before the provider or at it.
ANSWERED = "ok"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """One call a channel answered (a refused or malformed request is not a call)."""

    request_hash: str  # the replay key of ``request``
    request: dict[str, Any]  # the request's replay_request()
    agent: str
    status: str  # ANSWERED ("ok") or the GatewayError's kind
    # When ok: what its raw() recorded.
    reply: CompletionReply | ModerationReply | FetchReply | McpReply | ApiReply | None
    error: GatewayError | None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    latency_ms: int = 0
    attempts: int = 0  # tries made at the provider; 0 when none was (budget, no_route)


@dataclass(frozen=True, slots=True)
class Totals:
    calls: int
    answered: int
    tokens_in: int
    tokens_out: int
    cost_usd: float

    @property
    def failed(self) -> int:
        return self.calls - self.answered

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


def totals(records: Iterable[CallRecord]) -> Totals:
    """Calls are all recorded calls, failed ones too; tokens and cost what the provider
    counted for the answered ones (gates/model_calls.py sums stored calls the same way)."""
    calls = answered = tokens_in = tokens_out = 0
    cost = 0.0
    for record in records:
        calls += 1
        if record.status != ANSWERED:
            continue
        answered += 1
        tokens_in += record.tokens_in
        tokens_out += record.tokens_out
        cost += record.cost_usd
    return Totals(
        calls=calls, answered=answered, tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost
    )


# Where a project keeps its recordings (gate_runner.models: tests/recordings/<agent>/).
RECORDINGS_DIR = "tests/recordings"


@dataclass(frozen=True, slots=True)
class Answered:
    """One answered call, as a recording needs it: wherever it comes from (a channel's
    CallRecord, or a stored model call)."""

    agent: str
    key: str  # the replay key (request_hash)
    request: Any  # what the key was computed over; may be null when it was not kept
    response: Any  # CompletionReply.raw()


def recording_files(calls: Iterable[Answered]) -> list[tuple[str, dict[str, Any]]]:
    """Each answered call as ``(<agent>/<key[:24]>.json, document)``, the path relative to a
    project's RECORDINGS_DIR. The same request of one agent twice is one file, in the place
    of its first call, holding the last answer. An agent whose name is not one plain path
    component is left out (no recording could be found under it anyway)."""
    files: dict[str, dict[str, Any]] = {}
    for call in calls:
        if not safe_agent(call.agent):
            continue
        name, document = recording(call.key, call.request, call.response)
        files[f"{call.agent}/{name}"] = document
    return list(files.items())


def answered(records: Iterable[CallRecord]) -> Iterator[Answered]:
    for record in records:
        if record.reply is not None:
            yield Answered(record.agent, record.request_hash, record.request, record.reply.raw())


def export_recordings(records: Iterable[CallRecord], directory: Path) -> list[Path]:
    """Write each answered call as a replay recording under ``directory/<agent>/``; the same
    request twice is one file (the last answer). Returns the files written, in order."""
    written: list[Path] = []
    for relative, document in recording_files(answered(records)):
        agent = relative.split("/", 1)[0]
        written.append(
            write_recording(
                directory / agent, document["key"], document["request"], document["response"]
            )
        )
    return written

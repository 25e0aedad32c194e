"""What the gateway records of each call, its totals, and its export as replay recordings.

A recording is the file gate_runner/models.py ``ReplayModel`` reads:
``<agent>/<key[:24]>.json`` holding ``{"key", "request", "response"}``, where ``key`` is
``request_key(request)`` and ``response`` is what ``parse_reply`` accepts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate_runner.gateway_wire import CompletionReply, GatewayError

# An agent's name as a recording folder: one plain path component.
AGENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def safe_agent(name: str) -> bool:
    return AGENT_NAME.fullmatch(name) is not None and ".." not in name


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """One call a channel answered (a refused or malformed request is not a call)."""

    request_hash: str  # the replay key of ``request``
    request: dict[str, Any]  # CompletionRequest.replay_request()
    agent: str
    status: str  # "ok" or the GatewayError's kind
    reply: CompletionReply | None  # when ok; a recording stores its raw()
    error: GatewayError | None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    latency_ms: int = 0
    attempts: int = 0  # tries made at the provider; 0 when none was (budget, no_route)


@dataclass(frozen=True, slots=True)
class Totals:
    calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: float

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


def totals(records: Iterable[CallRecord]) -> Totals:
    """Calls are all recorded calls, failed ones too; tokens and cost what the provider
    counted."""
    calls = tokens_in = tokens_out = 0
    cost = 0.0
    for record in records:
        calls += 1
        tokens_in += record.tokens_in
        tokens_out += record.tokens_out
        cost += record.cost_usd
    return Totals(calls=calls, tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost)


def export_recordings(records: Iterable[CallRecord], directory: Path) -> list[Path]:
    """Write each answered call as a replay recording under ``directory/<agent>/``; the same
    request twice is one file (the last answer). Returns the files written, in order."""
    written: dict[Path, None] = {}
    for record in records:
        if record.reply is None or not safe_agent(record.agent):
            continue
        folder = directory / record.agent
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{record.request_hash[:24]}.json"
        document = {
            "key": record.request_hash,
            "request": record.request,
            "response": record.reply.raw(),
        }
        path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
        written[path] = None
    return list(written)

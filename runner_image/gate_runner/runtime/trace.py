"""The spans of one invocation, and how a span times its work and records how it ended."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..runtime_errors import AgentRunError, InvocationTimedOut
from .sdk import stop_processing


@dataclass
class Span:
    span_id: str
    parent_span_id: str | None
    span_order: int
    type: str
    name: str
    status: str = "ok"
    duration_ms: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "span_order": self.span_order,
            "type": self.type,
            "name": self.name,
            "status": self.status,
            "duration_ms": self.duration_ms,
            "metadata": self.metadata,
        }


class Trace:
    """Spans of one invocation, in the order they were opened."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()  # parallel children open spans from several threads
        # Called after each span opens, i.e. at every step of a run (case.py reports the run
        # context from it, so that a builder's late cleanup has it).
        self.watch: Callable[[], None] | None = None

    def open(self, type_: str, name: str, parent: Span | None, **metadata: Any) -> Span:
        with self._lock:
            span = Span(
                span_id=f"s{len(self.spans) + 1}",
                parent_span_id=parent.span_id if parent else None,
                span_order=len(self.spans) + 1,
                type=type_,
                name=name,
                metadata=dict(metadata),
            )
            self.spans.append(span)
        if self.watch is not None:
            self.watch()
        return span


def error_text(exc: BaseException) -> str:
    """How an error reads in a span or a run: our own messages plain, others with a type."""
    if isinstance(exc, AgentRunError | InvocationTimedOut):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@contextmanager
def timed(span: Span) -> Iterator[Span]:
    """Time a span's work and record how it ended: stopped, failed, or fine."""
    started = time.monotonic()
    try:
        yield span
    except stop_processing():
        span.metadata["stopped"] = True
        raise
    except (Exception, InvocationTimedOut) as exc:
        span.status = "error"
        span.metadata["error"] = error_text(exc)
        raise
    finally:
        span.duration_ms = int((time.monotonic() - started) * 1000)

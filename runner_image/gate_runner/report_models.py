"""The invocation reports' shapes as pydantic models: what decides, and explains, a report
that the fast check in reports.py does not accept. Imported only then (or by a test that
holds the two equal), so a case whose reports fit never imports pydantic."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SpanReport(_Report):
    span_id: str
    parent_span_id: str | None
    span_order: int
    type: str
    name: str
    status: str
    duration_ms: int
    metadata: dict[str, Any]


class InvocationReport(_Report):
    """What the agent's run gave: the `result` report, and `agent` before a cleanup."""

    status: str
    input: Any = None
    output: Any = None
    error: str | None = None
    provider_failure: str | None = None
    run_context: dict[str, Any] = {}
    traces: list[SpanReport] = []
    violations: list[str] = []
    setup_error: str | None = None
    cleanup_failure: str | None = None


class BuilderReport(_Report):
    context: dict[str, Any]
    input: Any = None


class CleanupReport(_Report):
    failure: str | None = None

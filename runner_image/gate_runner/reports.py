"""The shapes an invocation process may report over its channel, checked before use.

The reports come from the process that runs user code, so they are input, not ours: one
that does not fit these shapes fails its invocation ("malformed report") instead of
breaking the runner, which would turn a failed case into an error of the gate.

This channel is the runner's own, between its processes; the case's result that leaves the
container is contract.py's. A reported span becomes a contract ``Span`` as it is (case.py),
so ``SpanReport`` has exactly its fields, checked strictly here; a unit test holds the two
equal (tests/unit/test_result_contract.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


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


def checked(
    reports: Mapping[str, Any], kind: str, model: type[_Report]
) -> tuple[dict[str, Any] | None, str | None]:
    """(the report of ``kind`` as plain data, None), (None, why it does not fit), or
    (None, None) when the process sent no report of that kind."""
    if kind not in reports:
        return None, None
    data = reports[kind]
    try:
        report = model.model_validate(data)
    except (ValidationError, RecursionError) as exc:
        first = str(exc).splitlines()
        return None, " ".join(first[:3])[:500]
    return report.model_dump(exclude_unset=True), None

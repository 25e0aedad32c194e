"""The pydantic mirror of the runner's result document (runner_image/gate_runner, v1).

The runner never imports this package, so the two are kept in step by a contract test that
runs the real runner and validates its output here.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1
BEGIN_MARKER = b"===GATE-RUNNER-RESULT-BEGIN==="
END_MARKER = b"===GATE-RUNNER-RESULT-END==="


class SpanResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    span_id: str
    parent_span_id: str | None
    span_order: int
    type: str
    name: str
    status: str
    duration_ms: int
    metadata: dict[str, Any]


class InvocationResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    status: str
    passed: bool
    input: Any
    output: Any
    error: str | None
    failure_reason: str | None
    failed_assertions: list[str]
    run_context: dict[str, Any]
    duration_ms: int
    traces: list[SpanResult]


class CaseResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1]
    suite: str
    test_name: str
    agent_name: str | None
    runs: int
    success_threshold: int
    successes: int
    passed: bool
    case_error: str | None
    failure_reason: str | None
    duration_ms: int
    invocations: list[InvocationResult]


def without_nul(value: Any) -> Any:
    """Postgres text and JSONB cannot hold NUL; user output can. Replace it visibly."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    return value


class RunnerOutputError(Exception):
    """The container's stdout held no valid result document."""


def parse_runner_output(stdout: bytes) -> CaseResult:
    """Take the last complete marker block; anything before it is not ours to trust."""
    end = stdout.rfind(END_MARKER)
    begin = stdout.rfind(BEGIN_MARKER, 0, end if end >= 0 else None)
    if begin < 0 or end < 0:
        raise RunnerOutputError("the runner printed no result (no result markers in its output)")
    body = stdout[begin + len(BEGIN_MARKER) : end].strip()
    try:
        return CaseResult.model_validate(without_nul(json.loads(body)))
    except (ValueError, RecursionError) as exc:
        raise RunnerOutputError(f"the runner's result does not match contract v1: {exc}") from None

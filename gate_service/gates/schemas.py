"""The REST shapes of gates, cases and runs (design: REST contract v1).

A run's spans are answered in the runner's own shape (``gate_runner.contract.Span``); a run
holds the fields of the runner's ``Invocation`` and its ids (a unit test holds the two to
the same fields: tests/unit/test_result_contract.py).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gate_runner.contract import Span


class Schema(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class BundleRead(Schema):
    sha256: str
    size_bytes: int
    code_bytes: int
    fixture_bytes: int


class ModelCallTotals(Schema):
    """A case's or gate's model calls through the gateway: every recorded call (failed ones
    too), and the tokens and cost the provider counted."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0


class CaseRead(Schema):
    id: uuid.UUID
    suite: str
    agent_name: str
    test_name: str
    status: str
    passed: bool | None
    successes: int
    runs: int
    success_threshold: int
    duration_ms: int | None
    failure_reason: str | None
    agent_run_ids: list[uuid.UUID]
    agent_run_passed: list[bool]
    model_calls: ModelCallTotals


class GateRead(Schema):
    id: uuid.UUID
    status: str
    phase: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    filter: str | None
    model_mode: str | None
    labels: dict[str, Any]
    bundle: BundleRead
    total_cases: int
    passed_cases: int
    failed_cases: int
    judged_cases: int = Field(
        description="Cases with a verdict (passed, failed, error, cancelled), of total_cases"
    )
    error: str | None
    failure_reason: str | None
    problems: list[dict[str, Any]]
    warnings: list[dict[str, Any]] = Field(
        description="What the gate does not honour as the platform would: one item per agent "
        "and key ({file, agent, key, support: partial|not_in_gate, message}); see the README's "
        "support table"
    )
    model_calls: ModelCallTotals
    cases: list[CaseRead] = Field(
        description="The gate's cases in order; GET answers the first `cases_limit` of them "
        "and `next_cases` holds the path of the rest"
    )
    next_cases: str | None = Field(
        default=None,
        description="GET this path for the cases after those in `cases` (a CasePage); null "
        "when `cases` holds them all",
    )
    html_url: str = Field(
        description="The gate's results page: absolute under GATE_PUBLIC_URL, else a path"
    )


class CasePage(Schema):
    items: list[CaseRead]
    next: str | None = Field(description="The path of the page after this one; null at the end")


class GateSummary(Schema):
    id: uuid.UUID
    status: str
    phase: str
    created_at: datetime
    finished_at: datetime | None
    labels: dict[str, Any]
    failure_reason: str | None
    html_url: str = ""


class GateList(Schema):
    items: list[GateSummary]
    total: int
    limit: int
    offset: int


class RunRead(Schema):
    id: uuid.UUID
    case_id: uuid.UUID
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
    traces: list[Span]


class RecordingContent(Schema):
    """A replay recording as gate_runner.models.ReplayModel reads it: it looks the answer up
    by ``key``; ``request`` is null when the call's request was too large to keep."""

    key: str
    request: Any
    response: dict[str, Any]


class RecordingFile(Schema):
    path: str  # relative to the project: tests/recordings/<agent>/<key[:24]>.json
    content: RecordingContent


class RecordingsRead(Schema):
    """The gate's answered model calls as replay recordings (one file per agent and request,
    the last answer). ``left_out``: answered calls in no file, since their answer was not
    stored (over the stored cap) or their agent's name cannot be a folder name."""

    recordings: list[RecordingFile]
    left_out: int

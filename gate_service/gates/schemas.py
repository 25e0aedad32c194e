"""The REST shapes of gates, cases and runs (design: REST contract v1).

A run's spans are answered in the runner's own shape (``gate_runner.contract.Span``); a run
is its ids and the fields of the runner's ``Invocation``, taken from the contract
(``gate_service.results``), not listed here.
"""

from __future__ import annotations

import typing
import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gate_runner.contract import Invocation

from ..models import Case
from ..results import FieldDef, contract_fields, shape_model


class Schema(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def column_fields(table: type[Any], *, drop: set[str]) -> dict[str, FieldDef]:
    """A table's columns as required pydantic fields, in the table's order, each of the type
    its ``Mapped[...]`` annotation says."""
    hints = typing.get_type_hints(table)
    return {
        c.key: (typing.get_args(hints[c.key])[0], ...)
        for c in table.__table__.columns
        if c.key not in drop
    }


class BundleRead(Schema):
    sha256: str
    size_bytes: int
    code_bytes: int
    fixture_bytes: int


class ModelCallTotals(Schema):
    """A case's or gate's model calls through the gateway: every recorded call, those a
    provider answered and those that failed, and the tokens and cost of the answered ones."""

    calls: int = Field(default=0, description="Every recorded call: answered + failed")
    answered: int = Field(
        default=0, description="Calls a provider (a page's host, an MCP server, an API) answered"
    )
    failed: int = Field(
        default=0,
        description="Calls that got no answer: refused, no route, a budget, a provider's "
        "error or 429 after the retries, the deadline",
    )
    tokens_in: int = Field(default=0, description="Of the answered calls, as the provider counted")
    tokens_out: int = Field(default=0, description="Of the answered calls, as the provider counted")
    cost_usd: float = Field(default=0.0, description="Of the answered calls (LiteLLM's cost map)")


# A case is the cases table's row as stored (its columns in order, of their types; the table
# holds the suite's fields and the runner's result's, gates.lifecycle), less where it stands,
# then its runs' ids and verdicts and its model calls. (No docstring: see RunRead.)
_CASE_FIELDS: Any = shape_model(
    "CaseFields",
    Schema,
    column_fields(Case, drop={"gate_id", "position", "timeout_s"})
    | {
        "agent_run_ids": (list[uuid.UUID], ...),
        "agent_run_passed": (list[bool], ...),
        "model_calls": (ModelCallTotals, ...),
    },
)


class CaseRead(_CASE_FIELDS):  # type: ignore[misc]
    pass


class GateRead(Schema):
    id: uuid.UUID
    status: str
    phase: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    filter: str | None
    model_mode: str = Field(
        description="The mode the gate's LLM agents ran in: live, replay or scripted "
        "when they all ran in one, mixed when they differ, the submitted model_mode when one "
        "was; none when no LLM agent ran (no selected case reaches one, or the gate ended "
        "before validating worked the modes out); pending until validating has"
    )
    requested_model_mode: str | None = Field(
        default=None, description="The model_mode the submission forced, or null"
    )
    model_modes: dict[str, str] = Field(
        default_factory=dict,
        description="Each LLM agent the selected cases can run, with its model mode; empty "
        "until validating has worked them out",
    )
    model_mode_reason: str | None = Field(
        default=None,
        description="Why the agents run in those modes when no model_mode was submitted "
        "(the default rule, naming the agents per mode); null when one was, or until "
        "validating has worked them out",
    )
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
        "and key ({file, agent, key, support: partial|not_in_gate, message}); see the support "
        "table in docs/support.md. Key guardrails.judged (an agent's judged guardrails the "
        "gate skips) also has guardrails, cases (the first 10 it could change) and more_cases"
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


RUN_IDS = {"id": (uuid.UUID, ...), "case_id": (uuid.UUID, ...)}


_RUN_FIELDS: Any = shape_model("RunFields", Schema, RUN_IDS | contract_fields(Invocation))


# A run: its ids, then every field of the runner's ``Invocation`` in its order, its spans in
# the runner's ``Span`` shape. (No docstring: it would become the OpenAPI description.)
class RunRead(_RUN_FIELDS):  # type: ignore[misc]
    pass


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

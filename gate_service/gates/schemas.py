"""The REST shapes of gates, cases and runs (design: REST contract v1).

A run's spans are answered in the runner's own shape (``gate_runner.contract.Span``); a run
is its ids and the fields of the runner's ``Invocation``, taken from the contract
(``gate_service.results``), not listed here.
"""

from __future__ import annotations

import typing
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gate_runner.contract import Invocation

from ..baselines.schemas import BaselineRead, FlakyRead, IntervalRead, QuarantineNote
from ..models import Case
from ..results import FieldDef, contract_fields, shape_model


class Schema(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def column_fields(
    table: type[Any], *, drop: set[str], shaped: Mapping[str, FieldDef] | None = None
) -> dict[str, FieldDef]:
    """A table's columns as required pydantic fields, in the table's order, each of the type
    its ``Mapped[...]`` annotation says; ``shaped``: a column answered with its own field
    definition instead (a JSON column's shape, a description), in the same place."""
    shaped = shaped or {}
    hints = typing.get_type_hints(table)
    return {
        c.key: shaped.get(c.key, (typing.get_args(hints[c.key])[0], ...))
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


# The columns baselines added to a case (gate_service/baselines), each with its shape and
# what it means; the worker fills them as a gate ends (baselines/judging.py).
_BASELINE_COLUMNS: dict[str, FieldDef] = {
    "case_key": (
        str | None,
        Field(
            description="The case's identity across the project's gates (suite, agent, test "
            "name), hashed: GET /v1/projects/{name}/cases lists its history; null for cases "
            "judged before history was kept"
        ),
    ),
    "closure_hash": (
        str | None,
        Field(
            description="A hash of everything that can change the case's outcome (its YAML and "
            "the files it names, its agents and their model modes, tools, guardrails, "
            "requirements, the judge model): a flaky case's verdicts differ under one hash"
        ),
    ),
    "definition_hash": (
        str | None,
        Field(
            description="A hash of the case's own resolved YAML: a baseline's case is compared "
            "only when it is equal"
        ),
    ),
    "stopped_early": (
        bool,
        Field(
            description="Its verdict could no longer change, so only invocations_run of its "
            "runs were started"
        ),
    ),
    "invocations_run": (
        int | None,
        Field(
            description="The invocations it ran (fewer than runs after an early stop); null: "
            "as many as runs, or not judged yet"
        ),
    ),
    "baseline": (
        BaselineRead | None,
        Field(
            description="The same case in the gate's baseline, compared or why not; null "
            "without a baseline"
        ),
    ),
    "regression_level": (
        str | None,
        Field(
            description="Against the baseline: none, likely (a warning) or regression (fails "
            "the gate unless quarantined); null when not compared"
        ),
    ),
    "flaky": (
        FlakyRead | None,
        Field(
            description="Its verdicts differ across the project's recent gates with its "
            "closure hash; null when they do not (or it has passed GATE_FLAKY_CLEAR_PASSES "
            "gates in a row since)"
        ),
    ),
    "quarantine": (
        QuarantineNote | None,
        Field(
            description="The quarantine it ran under: its failure or regression did not fail "
            "the gate; null when none held"
        ),
    ),
    "reused_from": (
        uuid.UUID | None,
        Field(
            description="The baseline's case whose verdict this changed_only gate reported "
            "instead of running it; null when it ran"
        ),
    ),
}
# What a case answers beside its verdict (baselines/figures.py).
_FIGURE_FIELDS: dict[str, FieldDef] = {
    "interval": (
        IntervalRead | None,
        Field(
            default=None,
            description="The Wilson 95% interval of its pass rate over the invocations it "
            "ran; null before a verdict or with fewer than 2 invocations",
        ),
    ),
    "narrow": (
        bool,
        Field(
            default=False,
            description="Its success_threshold lies strictly inside the interval: the runs "
            "cannot tell on which side of it the case really is",
        ),
    ),
    "regression": (
        bool,
        Field(
            default=False,
            description="It regressed against the gate's baseline (regression_level regression)",
        ),
    ),
}
# What baselines add to a case: the REST case answers them, Connic's leaves them out (its
# shape is the platform's, which has none of them).
BASELINE_FIELDS = frozenset(_BASELINE_COLUMNS) | frozenset(_FIGURE_FIELDS)

# A case is the cases table's row as stored (its columns in order, of their types; the table
# holds the suite's fields and the runner's result's, gates.lifecycle), less where it stands,
# then its runs' ids and verdicts and its model calls, then its figures. (No docstring: see
# RunRead.)
_CASE_FIELDS: Any = shape_model(
    "CaseFields",
    Schema,
    column_fields(Case, drop={"gate_id", "position", "timeout_s"}, shaped=_BASELINE_COLUMNS)
    | {
        "agent_run_ids": (list[uuid.UUID], ...),
        "agent_run_passed": (list[bool], ...),
        "model_calls": (ModelCallTotals, ...),
    }
    | _FIGURE_FIELDS,
)


class CaseRead(_CASE_FIELDS):  # type: ignore[misc]
    pass


class SandboxRead(Schema):
    backend: str = Field(description="GATE_SANDBOX_BACKEND: docker")
    runtime: str = Field(
        description="The OCI runtime of its case containers: GATE_CASE_RUNTIME (runsc: "
        "gVisor), or the engine's default (runc)"
    )


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
    baseline: str | None = Field(
        default=None,
        description="The baseline the submission named: a gate id, or label:key=value (the "
        "project's last passing gate with that label); null: none",
    )
    baseline_gate_id: uuid.UUID | None = Field(
        default=None,
        description="The gate the baseline named when this gate was validated, whose cases "
        "its cases are compared with; null without a baseline, before validating, or when it "
        "named none (a warning says why)",
    )
    changed_only: bool = Field(
        default=False,
        description="Cases whose closure passed unchanged in the baseline (scripted or replay) "
        "were reported as reused (their reused_from) instead of run",
    )
    sandbox: SandboxRead | None = Field(
        default=None,
        description="What ran its cases: the sandbox backend and the OCI runtime of the case "
        "containers (runc, or runsc under gVisor); null until a worker started the gate",
    )
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


RUN_SANDBOX = {
    "sandbox": (
        SandboxRead | None,
        Field(
            default=None,
            description="What ran it: its gate's sandbox backend and the OCI runtime of the "
            "case container (runc, or runsc under gVisor), as the gate's own `sandbox`",
        ),
    )
}


_RUN_FIELDS: Any = shape_model(
    "RunFields", Schema, RUN_IDS | RUN_SANDBOX | contract_fields(Invocation)
)


# A run: its ids and what ran it, then every field of the runner's ``Invocation`` in its
# order, its spans in the runner's ``Span`` shape. (No docstring: it would become the
# OpenAPI description.)
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

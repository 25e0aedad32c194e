"""The wire shapes the unmodified `connic test` CLI sends and reads (connic-spec §9.2, §9.3).

Field names are Connic's, not ours: `connic test` reads them by name (cli.py `test`,
`_poll_test_run`, `_fetch_failed_run_details`). Class names avoid a `Test` prefix so pytest
never mistakes one for a test class when a test imports it.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gate_runner.contract import Invocation, Span

from ..gates.schemas import BASELINE_FIELDS, CaseRead
from ..gates.submission import MAX_TEXT_FIELD_BYTES
from ..results import FieldDef, contract_fields, shape_model
from ..text import StorableStr

# The one environment this service has; the CLI resolves it from GET .../environments.
DEFAULT_ENVIRONMENT_ID = "default"

ConnicStatus = Literal["running", "passed", "failed", "error", "cancelled"]


class ConnicEnvironment(BaseModel):
    """One entry of GET /projects/{pid}/environments, as the CLI picks its default from it."""

    id: str
    name: str
    env_type: Literal["standard", "test"]
    is_default: bool
    test_environment_id: str | None = Field(
        default=None, description="Connic's separate test environment; none here"
    )


class ConnicTestRunSubmit(BaseModel):
    """The JSON body of POST /projects/{pid}/test-runs (the CLI's `_kickoff_test_run`)."""

    # Fields a newer CLI adds are ignored rather than refused, as Connic's backend would.
    model_config = ConfigDict(extra="ignore")

    files_data: str = Field(
        min_length=1, description="The project as a base64-encoded .tar.gz (or .zip)"
    )
    environment_id: str | None = Field(
        default=None,
        max_length=200,
        description=f"Must be {DEFAULT_ENVIRONMENT_ID!r}, the only environment, when given",
    )
    test_filter: StorableStr | None = Field(
        default=None,
        max_length=MAX_TEXT_FIELD_BYTES,
        description="Run only cases whose name contains this",
    )


# The CLI's case: the gate's case (gates.schemas.CaseRead) without what the CLI does not
# read nor what baselines add (the platform has none of it), `passed` a plain flag.
_CASE_FIELDS = {
    name: (field.annotation, ...)
    for name, field in CaseRead.model_fields.items()
    if name not in {"id", "suite", "status", "duration_ms", "model_calls", *BASELINE_FIELDS}
} | {
    "passed": (
        bool,
        Field(description="False for a failed case and for one not (yet) judged"),
    )
}


class ConnicCase(shape_model("ConnicCaseFields", BaseModel, _CASE_FIELDS)):  # type: ignore[misc]
    """A case as the CLI renders it and passes it through to `--json` (connic-spec §9.3)."""


class ConnicTestRun(BaseModel):
    """A test run: the gate under Connic's names. `running` until the gate ends."""

    id: uuid.UUID = Field(description="The gate's id; GET /v1/gates/{id} reads the same gate")
    status: ConnicStatus
    phase: str = Field(description="The gate's phase (queued, validating, building, ...)")
    total_cases: int
    deployment_id: str | None = Field(
        default=None,
        description="The gate's id. The CLI prints {CONNIC_BASE_URL}/projects/{pid}/deployments/"
        "{deployment_id}?env=..., which the service redirects to the gate's results page when "
        "CONNIC_BASE_URL is the gate's address",
    )
    error: str | None = Field(description="Why the gate could not be judged (status error)")
    cases: list[ConnicCase]


# The CLI's span: the runner's ``Span`` with its metadata as JSON text.
_SPAN_FIELDS = contract_fields(
    Span,
    replace={
        "metadata": {
            "metadata_json": (str, Field(description="The span's metadata as a JSON text"))
        }
    },
)


class ConnicSpan(shape_model("ConnicSpanFields", BaseModel, _SPAN_FIELDS)):  # type: ignore[misc]
    """A trace span under the names the CLI keeps; `type == "log"` spans it drops itself."""


# The CLI's run: the runner's ``Invocation`` under the gate's run id, without the fields the
# CLI does not read, input and output as text, its spans as ConnicSpan.
_RUN_FIELDS: dict[str, FieldDef] = {"id": (uuid.UUID, ...)} | contract_fields(
    Invocation,
    drop={"index", "failed_assertions"},
    replace={
        "input": {
            "input": (
                str | None,
                Field(description="The invocation's input; JSON text unless a string"),
            )
        },
        "output": {
            "output": (str | None, Field(description="Its output; JSON text unless a string"))
        },
        "traces": {"traces": (list[ConnicSpan], ...)},
    },
)


class ConnicRun(shape_model("ConnicRunFields", BaseModel, _RUN_FIELDS)):  # type: ignore[misc]
    """One invocation of a case, as the CLI's failed-run drill-down reads it."""

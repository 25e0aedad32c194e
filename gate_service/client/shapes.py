"""The REST answers the client reads, as typed models: a run and its spans, a gate and its
cases, a case's failed runs as `gate submit` shows them.

A run's, a span's and a case's fields are the runner's contract's (``gate_runner.contract``,
through the leaf ``gate_service.results``), as the service's REST schemas take them, so a field
added there is read here too; a gate's are the REST schema's (``gates.schemas.GateRead``, which
the client may not import: a unit test holds the names equal). Every field may be missing (an
older or newer service answers less or more) and an unknown one is kept. A gate, its cases and
a case's failed runs are read leniently (``Lenient``): a value not of its field's type reads
as missing, and the answer as read stays at hand, so --json prints it as it came.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from gate_runner.contract import CaseResult, Invocation, Span

from ..results import FieldDef, contract_fields, shape_model


class Answer(BaseModel):
    """A REST answer as read: what is not declared is kept, not refused."""

    model_config = ConfigDict(extra="allow")


class SpanView(shape_model("SpanFields", Answer, contract_fields(Span, optional=True))):  # type: ignore[misc]
    """A run's trace span as GET /v1/runs/{id} answers it (the runner's ``Span``)."""


_RUN_FIELDS = {"id": (str | None, None)} | contract_fields(
    Invocation, optional=True, replace={"traces": {"traces": (list[SpanView], [])}}
)


class RunView(shape_model("RunFields", Answer, _RUN_FIELDS)):  # type: ignore[misc]
    """A run as GET /v1/runs/{id} answers it: its id and the runner's ``Invocation``."""


class Lenient(Answer):
    """An answer read for showing, not refused: a value not of its field's type (strictly,
    ``"yes"`` is no bool) reads as the field's default (missing), as the dict reads it replaced
    did, and ``as_answered()`` is the answer as it came."""

    model_config = ConfigDict(extra="allow", strict=True)

    _answer: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("*", mode="wrap")
    @classmethod
    def _or_missing(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        try:
            return handler(value)
        except ValidationError:
            return cls.model_fields[str(info.field_name)].get_default(call_default_factory=True)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_answer(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        view = handler(value)
        if isinstance(value, dict):
            view._answer = value
        return view

    @classmethod
    def of(cls, value: Self | Mapping[str, Any]) -> Self:
        """``value`` as this view: read, unless it is one already."""
        return value if isinstance(value, cls) else cls.model_validate(value)

    def as_answered(self) -> dict[str, Any]:
        return self._answer


class TraceSpan(
    shape_model(  # type: ignore[misc]
        "TraceSpanFields",
        Lenient,
        contract_fields(Span, optional=True) | {"metadata_json": (str | None, None)},
    )
):
    """A span of a failed run's trace: the REST shape (``metadata``) or `connic test
    --json`'s (``metadata_json``, the metadata as JSON text)."""

    def meta(self) -> dict[str, Any]:
        """Its metadata, from whichever of the two it has; ``{}`` when neither is a mapping."""
        if self.metadata is not None:
            return dict(self.metadata)
        try:
            meta = json.loads(self.metadata_json or "{}")
        except ValueError:
            return {}
        return meta if isinstance(meta, dict) else {}


_SHOWN_RUN_FIELDS = {"run_id": (str | None, None), "fetch_error": (str | None, None)} | (
    contract_fields(
        Invocation, optional=True, replace={"traces": {"traces": (list[TraceSpan], [])}}
    )
)


class ShownRun(shape_model("ShownRunFields", Lenient, _SHOWN_RUN_FIELDS)):  # type: ignore[misc]
    """A failed run as a case's ``failed_runs`` shows it: its id and the runner's
    ``Invocation``, or ``fetch_error`` when it could not be fetched."""


class FailedRuns(Lenient):
    """A case's failed runs, in the shape of `connic test --json`'s ``failed_runs``
    (``GateClient.failed_runs``): how many failed, and the first few."""

    total_failed: int | None = None
    shown: list[ShownRun] = []


class ModelCalls(Lenient):
    """A gate's model calls (``gates.schemas.ModelCallTotals``); ``answered`` is None from a
    service too old to tell answered calls apart."""

    calls: int | None = None
    answered: int | None = None
    failed: int | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None


class BaselineView(Lenient):
    """A case's baseline (``cases.baseline``): the baseline gate's case with its identity,
    its counts and the one-sided Fisher test of a drop; ``comparable`` false (``why`` says
    why) for a case new since the baseline or whose definition changed."""

    gate_id: str | None = None
    case_id: str | None = None
    successes: int | None = None
    runs: int | None = None
    comparable: bool | None = None
    why: str | None = None
    p_value: float | None = None
    drop_points: float | None = None


class FlakyView(Lenient):
    """A flaky case (``cases.flaky``): its verdicts differ across its last gates with one
    closure hash; its pass rate over them and that rate's 95% interval (percent)."""

    gates: int | None = None
    passed_gates: int | None = None
    successes: int | None = None
    runs: int | None = None
    low: float | None = None
    high: float | None = None


class QuarantineView(Lenient):
    """The quarantine a case ran under (``cases.quarantine``): its failure did not fail the
    gate. ``expires_at`` as answered (ISO 8601)."""

    owner: str | None = None
    reason: str | None = None
    expires_at: str | None = None


class IntervalView(Lenient):
    """A case's pass rate's 95% Wilson interval, in percent."""

    low: float | None = None
    high: float | None = None


# A case as GET /v1/gates/{id} answers it (``gates.schemas.CaseRead``): its id, the fields of
# the runner's ``CaseResult`` the cases table keeps, its status, its baselines columns, its
# runs' ids and verdicts and its model calls, the derived interval, narrow and regression;
# then the failed runs `gate submit` fetched for it. An older service answers none of the
# baselines fields: each reads as missing.
_NOT_KEPT = {"schema_version", "case_error", "invocations", "nonce"}
_CASE_FIELDS: dict[str, FieldDef] = (
    {"id": (str | None, None)}
    | contract_fields(CaseResult, optional=True, drop=_NOT_KEPT)
    | {
        "status": (str | None, None),
        "case_key": (str | None, None),
        "closure_hash": (str | None, None),
        "definition_hash": (str | None, None),
        "stopped_early": (bool | None, None),
        "invocations_run": (int | None, None),
        "baseline": (BaselineView | None, None),
        "regression_level": (str | None, None),
        "flaky": (FlakyView | None, None),
        "quarantine": (QuarantineView | None, None),
        "reused_from": (str | None, None),
        "agent_run_ids": (list[str | None], []),
        "agent_run_passed": (list[bool], []),
        "model_calls": (ModelCalls | None, None),
        "interval": (IntervalView | None, None),
        "narrow": (bool | None, None),
        "regression": (bool | None, None),
        "failed_runs": (FailedRuns | None, None),
    }
)


class CaseView(shape_model("CaseFields", Lenient, _CASE_FIELDS)):  # type: ignore[misc]
    """A case of a gate's answer, with the failed runs the client fetched for it."""

    def runs_done(self) -> int:
        """The invocations it ran: fewer than its runs after an early stop."""
        if self.invocations_run is not None:
            return int(self.invocations_run)
        return int(self.runs or 0)

    def failed_run_ids(self) -> list[str]:
        """The ids of its runs that did not pass, in order."""
        pairs = zip(self.agent_run_ids, self.agent_run_passed, strict=False)
        return [str(rid) for rid, ok in pairs if rid and not ok]

    def as_answered(self) -> dict[str, Any]:
        """The case as the service answered it, with its failed runs: `connic test --json`'s."""
        answer: dict[str, Any] = self._answer
        failed_runs: FailedRuns | None = self.failed_runs
        if failed_runs is None:
            return answer
        return {**answer, "failed_runs": failed_runs.as_answered()}


class GateView(Lenient):
    """A gate as GET /v1/gates/{id} answers it (``gates.schemas.GateRead``): the fields the
    client reads. ``problems`` and ``warnings`` are free-form items (``{file, message, ...}``)."""

    id: str | None = None
    status: str | None = None
    phase: str | None = None
    labels: dict[str, Any] = {}
    model_mode: str | None = None
    requested_model_mode: str | None = None
    model_modes: dict[str, str] = {}
    model_mode_reason: str | None = None
    total_cases: int | None = None
    judged_cases: int | None = None
    error: str | None = None
    failure_reason: str | None = None
    problems: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    model_calls: ModelCalls | None = None
    cases: list[CaseView] = []
    html_url: str | None = None
    # Baselines: as submitted (a gate id or label:key=value), the gate it named when the gate
    # was validated, and whether only changed cases ran. None from an older service.
    baseline: str | None = None
    baseline_gate_id: str | None = None
    changed_only: bool | None = None
    # What ran its cases ({backend, runtime}); None before a worker started it, or from an
    # older service.
    sandbox: dict[str, str] | None = None

"""The REST answers the client reads, as typed models: a run and its spans, a case.

A run's and a span's fields are the runner's contract's (``gate_runner.contract``, through
the leaf ``gate_service.results``), as the service's REST schemas take them, so a field
added there is read here too. Every field may be missing (an older or newer service answers
less or more) and an unknown one is kept, so what passes through to ``--json`` stays whole.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from gate_runner.contract import Invocation, Span

from ..results import contract_fields, shape_model


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


class CaseView(Answer):
    """A case of a gate's answer, the fields the client reads to fetch its failed runs."""

    agent_run_ids: list[str | None] = []
    agent_run_passed: list[bool] = []

    def failed_run_ids(self) -> list[str]:
        """The ids of its runs that did not pass, in order."""
        pairs = zip(self.agent_run_ids, self.agent_run_passed, strict=False)
        return [str(rid) for rid, ok in pairs if rid and not ok]


def parsed_case(case: dict[str, Any] | CaseView) -> CaseView:
    return case if isinstance(case, CaseView) else CaseView.model_validate(case)

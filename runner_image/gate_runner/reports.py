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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# What the fast check accepts of a value read from JSON, as pydantic's strict mode does: the
# exact type (strict int refuses a bool), None only where the field is optional.
Check = Callable[[Any], bool]


def _is_str(value: Any) -> bool:
    return type(value) is str


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_str_or_none(value: Any) -> bool:
    return value is None or type(value) is str


def _is_dict(value: Any) -> bool:
    return type(value) is dict and all(type(k) is str for k in value)


def _is_any(value: Any) -> bool:
    return True


def _is_str_list(value: Any) -> bool:
    return type(value) is list and all(type(v) is str for v in value)


@dataclass(frozen=True)
class Shape:
    """One report's fields (report_models.py has the same as a pydantic model, by name)."""

    model: str
    required: Mapping[str, Check]
    optional: Mapping[str, Check]

    def fits(self, data: Any) -> bool:
        if type(data) is not dict:
            return False
        if not all(name in data for name in self.required):
            return False
        for name, value in data.items():
            check = self.required.get(name) or self.optional.get(name)
            if check is None or not check(value):
                return False
        return True


SPAN = Shape(
    "SpanReport",
    required={
        "span_id": _is_str,
        "parent_span_id": _is_str_or_none,
        "span_order": _is_int,
        "type": _is_str,
        "name": _is_str,
        "status": _is_str,
        "duration_ms": _is_int,
        "metadata": _is_dict,
    },
    optional={},
)


def _is_span_list(value: Any) -> bool:
    return type(value) is list and all(SPAN.fits(v) for v in value)


INVOCATION = Shape(
    "InvocationReport",  # what the agent's run gave: `result`, and `agent` before a cleanup
    required={"status": _is_str},
    optional={
        "input": _is_any,
        "output": _is_any,
        "error": _is_str_or_none,
        "provider_failure": _is_str_or_none,
        "run_context": _is_dict,
        "traces": _is_span_list,
        "violations": _is_str_list,
        "setup_error": _is_str_or_none,
        "cleanup_failure": _is_str_or_none,
    },
)
BUILDER = Shape("BuilderReport", required={"context": _is_dict}, optional={"input": _is_any})
CLEANUP = Shape("CleanupReport", required={}, optional={"failure": _is_str_or_none})


def checked(
    reports: Mapping[str, Any], kind: str, shape: Shape
) -> tuple[dict[str, Any] | None, str | None]:
    """(the report of ``kind`` as plain data, None), (None, why it does not fit), or
    (None, None) when the process sent no report of that kind.

    A report that fits is taken as it is (copied where the runner adds to it). Only one
    that does not is handed to pydantic, for the decision and the words of its refusal.
    """
    if kind not in reports:
        return None, None
    data = reports[kind]
    if shape.fits(data):
        copy = dict(data)
        if "traces" in copy:
            copy["traces"] = [dict(span) for span in copy["traces"]]
        return copy, None
    from pydantic import ValidationError

    from . import report_models

    model = getattr(report_models, shape.model)
    try:
        report = model.model_validate(data)
    except (ValidationError, RecursionError) as exc:
        first = str(exc).splitlines()
        return None, " ".join(first[:3])[:500]
    return report.model_dump(exclude_unset=True), None

"""The runner's result contract: the one JSON document a case container prints, defined once.

Owns the shapes of a case's result (``CaseResult``), its invocations (``Invocation``) and
their trace spans (``Span``), the schema version, the marker lines the document stands
between, and the cut mark that shortened strings end in. The runner builds these objects and
prints them (``CaseResult.to_json``); the service validates what a container printed against
these same classes with pydantic (gate_service/runner_contract.py) and answers the API's
spans in this shape, so a field is on both sides or on neither.

May import the standard library only, and never ``gate_service``: the runner loads this on
every case, and loading pydantic or the connic SDK there is a cost it must be able to drop.

Adding, removing or retyping a field is a new schema version: a service refuses a document
with a field it does not know (each class's ``__pydantic_config__``), so an old service
could not read the new runner's results, nor a new service the old runner's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Final, Literal

SchemaVersion = Literal[2]
SCHEMA_VERSION: Final[SchemaVersion] = 2
# A builder's cleanup may run this long after its agent is done (timeout_s, at most this):
# the runner enforces it, and the worker counts it into each case container's deadline.
MAX_CLEANUP_SECONDS = 120
# The document is one line between these two lines, alone on the runner's stdout.
BEGIN_MARKER: Final = "===GATE-RUNNER-RESULT-BEGIN==="
END_MARKER: Final = "===GATE-RUNNER-RESULT-END==="

# pydantic reads this from a stdlib dataclass it validates (here no pydantic is imported):
# a field the class does not declare is refused, not dropped.
_REFUSE_UNKNOWN_FIELDS: Final = {"extra": "forbid"}


def cut_mark(cut_bytes: int) -> str:
    """How a shortened string or container ends: the runner and the service cut alike, so a
    stored run counts its cut bytes the same whoever cut it (gate_service.stored_runs)."""
    return f"…[{cut_bytes} bytes cut]"


def framed(document: str) -> str:
    """The result block as the runner prints it: ``document`` alone between the markers."""
    return f"{BEGIN_MARKER}\n{document}\n{END_MARKER}\n"


def _shallow(shape: Span | Invocation | CaseResult) -> dict[str, Any]:
    # Field by field in declaration order (the document's key order); values are not copied
    # or walked, unlike dataclasses.asdict, which would deep-copy every output.
    return {f.name: getattr(shape, f.name) for f in fields(shape)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One step of an invocation's trace: an agent, tool call, hook, model call or log line.

    Spans come from the invocation process, which runs the bundle's code, so their content is
    what that code says; only their shape is checked.
    """

    __pydantic_config__: ClassVar[dict[str, str]] = _REFUSE_UNKNOWN_FIELDS

    span_id: str
    parent_span_id: str | None
    span_order: int
    type: str
    name: str
    status: str
    duration_ms: int
    metadata: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return _shallow(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Invocation:
    """One of a case's `runs`: what went in and came out, the runner's judgement, its trace."""

    __pydantic_config__: ClassVar[dict[str, str]] = _REFUSE_UNKNOWN_FIELDS

    index: int  # 0-based, in the order of the case's runs
    status: str  # how the agent's run ended (completed, failed, cancelled, ...)
    passed: bool  # no assertion failed
    input: Any
    output: Any
    error: str | None
    failure_reason: str | None  # the failed assertions in one sentence; None when passed
    failed_assertions: list[str]
    run_context: dict[str, Any]
    duration_ms: int
    traces: list[Span]

    def as_dict(self) -> dict[str, Any]:
        return {**_shallow(self), "traces": [span.as_dict() for span in self.traces]}


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """A case's result: its invocations and the runner's verdict.

    The worker takes none of `runs`, `success_threshold`, `successes` and `passed` on trust:
    it recomputes the verdict from the invocations and the suite it validated itself.
    """

    __pydantic_config__: ClassVar[dict[str, str]] = _REFUSE_UNKNOWN_FIELDS

    schema_version: SchemaVersion
    suite: str  # the suite's path in the project
    test_name: str
    agent_name: str | None  # None when the case could not be judged (case_error)
    runs: int
    success_threshold: int  # percent
    successes: int
    passed: bool
    case_error: str | None  # why the case could not be judged at all, else None
    failure_reason: str | None
    duration_ms: int
    invocations: list[Invocation]
    # The worker's per-container nonce, which user code never sees; None in-process.
    nonce: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**_shallow(self), "invocations": [inv.as_dict() for inv in self.invocations]}

    def to_json(self) -> str:
        """The document as the runner prints it: one line (JSON escapes every newline).

        A value JSON cannot hold is printed as its repr rather than breaking the runner.
        """
        return json.dumps(self.as_dict(), default=repr)

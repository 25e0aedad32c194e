"""The REST shapes of baselines: a case's interval and the JSON its row stores (baseline,
flakiness, quarantine), which ``gates.schemas.CaseRead`` answers; a project's case history
(``GET /v1/projects/{name}/cases``); quarantines and their admin routes.

pydantic only: ``gates.schemas`` imports it, and it imports nothing of ``gates``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..text import StorableStr

# A case's identity as a quarantine names it: the names as the cases answer them. Longer
# names (a suite path, an agent or test name) cannot be quarantined.
MAX_NAME_CHARS = 4096
# Who answers for a quarantine (a name or an address), and why it was set.
MAX_OWNER_CHARS = 200
MAX_REASON_CHARS = 2000


class IntervalRead(BaseModel):
    """A pass rate's Wilson score 95% interval, in percent (0-100)."""

    low: float = Field(description="Its lower end, in percent")
    high: float = Field(description="Its upper end, in percent")


class BaselineRead(BaseModel):
    """A case against the same case in its gate's baseline gate (what the worker stored)."""

    gate_id: uuid.UUID = Field(description="The baseline gate")
    case_id: uuid.UUID | None = Field(
        description="The baseline gate's case with this identity; null when it has none"
    )
    successes: int | None = Field(description="The baseline case's passing invocations")
    runs: int | None = Field(description="The invocations the baseline case ran")
    comparable: bool = Field(
        description="Whether the two were compared: the baseline's case was judged, ran every "
        "invocation and has the same definition (its own YAML)"
    )
    why: str | None = Field(description="Why they were not compared; null when they were")
    p_value: float | None = Field(
        description="One-sided Fisher exact p-value that the pass rate dropped; null when not "
        "compared"
    )
    drop_points: float | None = Field(
        description="The drop of the pass rate from the baseline's, in percentage points "
        "(negative: it rose); null when not compared"
    )


class FlakyRead(BaseModel):
    """A case whose verdicts differ across the project's gates with its closure hash."""

    gates: int = Field(description="Judged gates looked at (this one included)")
    passed_gates: int = Field(description="Of those, the gates where it passed")
    successes: int = Field(description="Passing invocations over those gates")
    runs: int = Field(description="Invocations over those gates")
    low: float = Field(description="The Wilson 95% interval's lower end, in percent")
    high: float = Field(description="The Wilson 95% interval's upper end, in percent")


class QuarantineNote(BaseModel):
    """The quarantine a case ran under: its failure (or regression) did not fail its gate."""

    owner: str
    reason: str
    expires_at: datetime


# -- quarantines ---------------------------------------------------------------------------


class CaseIdentity(BaseModel):
    """A case across gates: its suite's path, its agent and its test name, as a case of
    ``GET /v1/gates/{id}`` or ``GET /v1/projects/{name}/cases`` names them."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)

    suite: StorableStr = Field(
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description="The suite's path in the project: tests/bot.yaml",
    )
    agent_name: StorableStr = Field(
        min_length=1, max_length=MAX_NAME_CHARS, description="The case's agent"
    )
    test_name: StorableStr = Field(
        min_length=1, max_length=MAX_NAME_CHARS, description="The case's name in its suite"
    )


def _printable_line(value: str) -> str:
    for at, ch in enumerate(value):
        if not ch.isprintable():
            raise ValueError(
                f"holds the unprintable character U+{ord(ch):04X} at position {at + 1}"
            )
    return value


class QuarantinePut(BaseModel):
    """A quarantine: the case still runs and is reported, but until ``expires_at`` its
    failure (or regression) does not fail a gate."""

    model_config = ConfigDict(extra="forbid")

    case: CaseIdentity
    owner: StorableStr = Field(
        min_length=1,
        max_length=MAX_OWNER_CHARS,
        description="Who answers for it: a name or an address, one printable line",
    )
    reason: StorableStr = Field(
        min_length=1, max_length=MAX_REASON_CHARS, description="Why the case is quarantined"
    )
    expires_at: datetime = Field(
        description="When it ends by itself (ISO 8601; UTC without an offset): in the future "
        "and at most GATE_MAX_QUARANTINE_DAYS ahead"
    )

    @field_validator("owner")
    @classmethod
    def _owner(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is blank")
        return _printable_line(value)

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is blank")
        return value

    @field_validator("expires_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class QuarantineRead(BaseModel):
    """A quarantine of a project's case."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    project: str
    case: CaseIdentity
    case_key: str = Field(description="The case's identity, hashed (as its cases carry it)")
    owner: str
    reason: str
    expires_at: datetime
    active: bool = Field(description="Whether it holds now (expires_at is still ahead)")
    created_at: datetime = Field(description="When it was set (or last replaced)")
    created_by: uuid.UUID | None = Field(description="The admin token that set it")


class QuarantineList(BaseModel):
    """The project's quarantines that hold, and those that ended in the last 30 days; the
    active first, each kind soonest to end first."""

    project: str
    items: list[QuarantineRead]
    total: int
    limit: int
    offset: int


# -- a case's history ------------------------------------------------------------------------


class CaseGateRead(BaseModel):
    """The case in one of the project's gates."""

    gate_id: uuid.UUID
    case_id: uuid.UUID
    created_at: datetime = Field(description="When the gate was submitted")
    gate_status: str = Field(description="The gate's status")
    status: str = Field(description="The case's status in it")
    successes: int = Field(description="Its passing invocations")
    runs: int = Field(description="The invocations it ran (fewer than planned after an early stop)")
    closure_hash: str | None
    stopped_early: bool
    reused: bool = Field(
        description="The gate reported its baseline's verdict instead of running it "
        "(changed_only); not counted in the figures"
    )


class CaseHistoryRead(BaseModel):
    """One case identity of the project and its recent gates. The figures (gates, successes,
    runs, pass_rate, interval, narrow) are over its last GATE_HISTORY_GATES judged gates with
    its latest closure hash, reused verdicts left out."""

    case_key: str = Field(description="The case's identity (suite, agent, test name), hashed")
    suite: str
    agent_name: str
    test_name: str
    closure_hash: str | None = Field(
        description="The closure hash of its newest judged case (of its newest case when none "
        "was judged): the figures are of this closure"
    )
    success_threshold: int = Field(description="Its newest case's threshold, in percent")
    gates: int = Field(description="Judged gates counted")
    passed_gates: int = Field(description="Of those, the gates where it passed")
    successes: int = Field(description="Passing invocations over those gates")
    runs: int = Field(description="Invocations over those gates")
    pass_rate: float | None = Field(description="successes / runs in percent; null with no runs")
    interval: IntervalRead | None = Field(
        description="The pass rate's Wilson 95% interval; null with no runs"
    )
    narrow: bool = Field(
        description="The threshold lies strictly inside the interval: the runs cannot tell on "
        "which side of it the case is"
    )
    flaky: FlakyRead | None = Field(
        description="Its newest judged case's flakiness (verdicts differ across gates with its "
        "closure hash); null when it is not flaky"
    )
    quarantine: QuarantineRead | None = Field(description="Its quarantine, while one holds")
    recent: list[CaseGateRead] = Field(
        description="Its last GATE_HISTORY_GATES gates, whatever their closure, newest first"
    )


class CaseHistoryList(BaseModel):
    """A page of the project's case identities, by suite, agent and test name."""

    project: str
    history_gates: int = Field(description="GATE_HISTORY_GATES: the gates each figure is over")
    items: list[CaseHistoryRead]
    total: int = Field(description="Case identities of the project")
    limit: int
    offset: int

"""Every table, in one place so that Alembic sees them all and domains cannot import-cycle."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class GateStatus(StrEnum):
    queued = "queued"
    running = "running"
    passed = "passed"
    failed = "failed"
    error = "error"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (
            GateStatus.passed,
            GateStatus.failed,
            GateStatus.error,
            GateStatus.cancelled,
        )


class Phase(StrEnum):
    queued = "queued"
    validating = "validating"
    building = "building"
    starting_container = "starting_container"
    running_tests = "running_tests"
    done = "done"
    error = "error"


class CaseStatus(StrEnum):
    queued = "queued"
    running = "running"
    passed = "passed"
    failed = "failed"
    error = "error"
    cancelled = "cancelled"


class JobState(StrEnum):
    queued = "queued"
    running = "running"
    done = "done"


DEFAULT_PROJECT = "default"  # the bootstrap project; its admin tokens administer the service


class Project(Base):
    """A tenant: its tokens, gates, secrets and audit trail are its own."""

    __tablename__ = "projects"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    retention_days: Mapped[int] = mapped_column(Integer, default=30)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The project's model routes, in order (gate_service.gateway.ModelRoute as
    # {"pattern", "api_base", "key_secret"}): model names they match go to that endpoint.
    model_routes: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, default=list, server_default="[]"
    )
    # Hosts a case's web_read_page may reach through the model gateway (endpoints.py's
    # host_allowed: a name, *.domain or address); empty: none.
    egress_hosts: Mapped[list[str]] = mapped_column(JSONB, default=list, server_default="[]")
    # prefix -> {base_url, headers, tools}: the project's api: tools (gate_service/api_specs).
    api_specs: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    # The model that judges the agents' prompt_injection, topic_restriction,
    # system_prompt_leakage, data_exfiltration and relevance guardrails; None: they are
    # skipped and the gate warns.
    guardrail_model: Mapped[str | None] = mapped_column(String(200))
    # How a case with runs > 1 is judged (gate_service/baselines): "threshold", the
    # platform's successes/runs against success_threshold, or "wilson", by its interval.
    verdict_rule: Mapped[str] = mapped_column(
        String(16), default="threshold", server_default="threshold"
    )


class ApiToken(Base):
    """A bearer token of one project. Only the SHA-256 of the token is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str | None] = mapped_column(String(200))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSONB, default=list)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class UiSession(Base):
    """A sign-in to the results pages (gate_service.ui): the cookie's random id, stored only as
    a SHA-256, and the token it was made with, whose revocation or expiry ends it too."""

    __tablename__ = "ui_sessions"

    id_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class ProjectSecret(Base):
    """A project's secret, encrypted at rest; it reaches case containers by name."""

    __tablename__ = "project_secrets"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(128))
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AuditEvent(Base):
    """Who did what: submissions, cancellations, token and secret changes, failed auth."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    project_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    token_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    action: Mapped[str] = mapped_column(String(64))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)


class Bundle(Base):
    """An uploaded archive, stored once per content hash so any worker can fetch it; its
    bytes are in ``bundle_chunks``."""

    __tablename__ = "bundles"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    archive_format: Mapped[str] = mapped_column(String(16))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    code_bytes: Mapped[int] = mapped_column(BigInteger)
    fixture_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


BUNDLE_CHUNK_BYTES = 512 * 1024


class BundleChunk(Base):
    """A bundle's bytes in pieces of at most BUNDLE_CHUNK_BYTES, in order of ``seq``: written
    and read a piece at a time, so no process ever holds a whole 25 MiB upload in memory
    (one bytea value would be built, sent and received whole)."""

    __tablename__ = "bundle_chunks"

    sha256: Mapped[str] = mapped_column(
        String(64), ForeignKey("bundles.sha256", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Gate(Base):
    __tablename__ = "gates"
    # Idempotency keys are per project: another project's key reveals nothing.
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key"),
        # A case's history and a label's last passing gate walk a project's gates by age.
        Index("ix_gates_project_id_created_at", "project_id", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    status: Mapped[str] = mapped_column(String(16), default=GateStatus.queued, index=True)
    phase: Mapped[str] = mapped_column(String(32), default=Phase.queued)
    bundle_sha256: Mapped[str] = mapped_column(ForeignKey("bundles.sha256"), index=True)
    filter: Mapped[str | None] = mapped_column(Text)
    # Forces one model mode (scripted, replay, live) for every LLM agent of the gate.
    model_mode: Mapped[str | None] = mapped_column(String(16))
    # Each LLM agent's mode as worked out in validating ({"agent": "live"}), and why when no
    # mode was forced; empty until then.
    model_modes: Mapped[dict[str, str]] = mapped_column(JSONB, default=dict, server_default="{}")
    model_mode_reason: Mapped[str | None] = mapped_column(Text)
    labels: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(Text)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    problems: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list)
    # What the gate does not honour as the platform would (bundles/support.py), per agent.
    warnings: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list, server_default="[]")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # The baseline as the submission named it: a gate id, or "label:key=value" (the last
    # passing gate of the project with that label); baseline_gate_id is the gate it named
    # when the gate was validated (gate_service/baselines).
    baseline: Mapped[str | None] = mapped_column(String(300))
    baseline_gate_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # Incremental: cases whose closure passed in the baseline (scripted or replay) are
    # reported as reused, not run again.
    changed_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # What ran its cases: {"backend": GATE_SANDBOX_BACKEND, "runtime": the OCI runtime}, as
    # the worker that started it had them; NULL before it started.
    sandbox: Mapped[dict[str, str] | None] = mapped_column(JSONB)
    # Stored bytes of the gate's runs and model calls (their stored_bytes): the project's
    # quota sums it.
    result_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Bumped on every visible change; the ETag and long-poll compare it.
    revision: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Job(Base):
    """The queue: one row per gate, claimed with FOR UPDATE SKIP LOCKED under a lease."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    gate_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("gates.id", ondelete="CASCADE"), unique=True
    )
    state: Mapped[str] = mapped_column(String(16), default=JobState.queued, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, server_default=func.now()
    )


class Case(Base):
    __tablename__ = "cases"
    __table_args__ = (UniqueConstraint("gate_id", "suite", "test_name"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    gate_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("gates.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(Integer)
    suite: Mapped[str] = mapped_column(Text)
    agent_name: Mapped[str] = mapped_column(Text)
    test_name: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default=CaseStatus.queued)
    passed: Mapped[bool | None] = mapped_column(Boolean)
    successes: Mapped[int] = mapped_column(Integer, default=0)
    runs: Mapped[int] = mapped_column(Integer)
    success_threshold: Mapped[int] = mapped_column(Integer)
    timeout_s: Mapped[int] = mapped_column(Integer)
    duration_ms: Mapped[int | None] = mapped_column(Integer)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    # The case's identity across the project's gates (suite, agent, test name), hashed, and
    # the hash of everything that can change its outcome (gate_service/baselines/closure.py);
    # None for cases stored before history was kept.
    case_key: Mapped[str | None] = mapped_column(String(64), index=True)
    closure_hash: Mapped[str | None] = mapped_column(String(64))
    # The case's own resolved YAML, hashed: a baseline's case is comparable only when equal.
    definition_hash: Mapped[str | None] = mapped_column(String(64))
    # Early stop: the verdict could no longer change, so only invocations_run were started.
    stopped_early: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    invocations_run: Mapped[int | None] = mapped_column(Integer)
    # {gate_id, case_id, successes, runs, comparable, why, p_value}: the baseline's case.
    baseline: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    regression_level: Mapped[str | None] = mapped_column(String(16))  # none, likely, regression
    # {successes, runs, gates, low, high}: verdicts differ across gates with its closure.
    flaky: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    # {owner, reason, expires_at}: it ran quarantined, so its failure did not fail the gate.
    quarantine: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    # The baseline's case an incremental gate reported instead of running this one.
    reused_from: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))


class CaseQuarantine(Base):
    """A quarantined case of a project: it still runs and is reported, but its failure does
    not fail a gate until ``expires_at``. Set by an admin only (never from a bundle)."""

    __tablename__ = "case_quarantines"
    __table_args__ = (UniqueConstraint("project_id", "case_key"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    case_key: Mapped[str] = mapped_column(String(64))
    suite: Mapped[str] = mapped_column(Text)
    agent_name: Mapped[str] = mapped_column(Text)
    test_name: Mapped[str] = mapped_column(Text)
    owner: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    created_by: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))


class Run(Base):
    """One invocation of a case: what went in, what came out, and its trace.

    Its columns are the fields of the runner's ``gate_runner.contract.Invocation``, the JSON
    ones as ``stored_runs.pack_run`` stores them (storable, shared, capped), so they are
    plain JSON here, not the runner's types.
    """

    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("case_id", "index"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    case_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("cases.id", ondelete="CASCADE"), index=True
    )
    index: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(32))
    passed: Mapped[bool] = mapped_column(Boolean)
    input: Mapped[Any] = mapped_column(JSONB, nullable=True)
    output: Mapped[Any] = mapped_column(JSONB, nullable=True)
    error: Mapped[str | None] = mapped_column(Text)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    failed_assertions: Mapped[list[str]] = mapped_column(JSONB, default=list)
    run_context: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    duration_ms: Mapped[int] = mapped_column(Integer, default=0)
    traces: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list)
    # Values that occur more than once in the run, each stored once; the fields above hold
    # {"$gate.value": id} where they stood (gate_service.stored_runs).
    shared_values: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    # Bytes of the JSON text of all the run stores (fields and shared values).
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class ModelCall(Base):
    """One call a case's model gateway channel answered (gate_service.gateway.CallRecord),
    as ``gates.model_calls.save_model_calls`` stores it: redacted, storable, and counted into
    the gate's result_bytes like its runs.

    ``request`` is null when its JSON is over the stored cap: replaying a call needs only
    ``request_hash`` (the replay key) and ``response``, so a huge conversation is not kept
    just to be looked at. ``response`` is the reply as a recording holds it
    (``CompletionReply.raw()``), null for a failed call or one over the cap; ``error`` the
    ``GatewayError`` (kind, message, limit, allowed, used) of a failed one.
    """

    __tablename__ = "model_calls"
    __table_args__ = (UniqueConstraint("case_id", "position"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    gate_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("gates.id", ondelete="CASCADE"), index=True
    )
    # Found by the unique (case_id, position) index: deleting a case (retention) cascades
    # here, and a retried case replaces its calls.
    case_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("cases.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)  # the call's order within its case
    agent: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    # None is SQL NULL (not JSON null): "not stored" is what IS NULL finds.
    request: Mapped[Any] = mapped_column(JSONB(none_as_null=True), nullable=True)
    response: Mapped[Any] = mapped_column(JSONB(none_as_null=True), nullable=True)
    error: Mapped[Any] = mapped_column(JSONB(none_as_null=True), nullable=True)
    status: Mapped[str] = mapped_column(String(32))
    tokens_in: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens_out: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    latency_ms: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Bytes of the JSON text of all the row stores: counted into Gate.result_bytes.
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ProjectModelSpend(Base):
    """A project's model spending in one budget window, shared by every worker's gateway
    (gate_service/gateway/spend.py): one row per project and window."""

    __tablename__ = "project_model_spend"

    project_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True
    )
    # The window's start in seconds since the epoch: windows are aligned to it.
    window_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)

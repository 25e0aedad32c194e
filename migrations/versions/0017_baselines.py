"""Baselines: a case's identity and closure across gates, a gate's baseline, quarantines

``cases.case_key``: the sha256 of the case's identity (suite path, agent, test name) within
its project, indexed: its history is every case of the project's gates with the same key.
``cases.closure_hash``: the sha256 of everything that can change the case's outcome (its
YAML, its agent's closure, the model modes and names; gate_service/baselines/closure.py):
a flaky case is one whose verdicts differ under one hash. ``cases.definition_hash``: the
sha256 of the case's own resolved YAML: a baseline's case is comparable only when it is equal
(otherwise the two rates are of different tests). NULL for cases stored before this revision.
``cases.stopped_early``/``cases.invocations_run``: early stop (fewer invocations than runs
were started, because the verdict could no longer change). ``cases.baseline``: the case's
baseline counts and regression test; ``cases.regression_level``: none, likely, regression;
``cases.flaky``: its observed rate when its verdicts differ across gates with its closure;
``cases.quarantine``: the quarantine the case ran under; ``cases.reused_from``: the baseline
case an incremental gate reported instead of running it.

``gates.baseline``: the baseline as asked (a gate id, or label:key=value);
``gates.baseline_gate_id``: the gate it named when the gate was judged;
``gates.changed_only``: run only cases whose closure changed since the baseline.

``projects.verdict_rule``: threshold (the platform's rule) or wilson.

``case_quarantines``: a project's quarantined cases, each with an owner, a reason and an end.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("cases", sa.Column("case_key", sa.String(64), nullable=True))
    op.add_column("cases", sa.Column("closure_hash", sa.String(64), nullable=True))
    op.add_column("cases", sa.Column("definition_hash", sa.String(64), nullable=True))
    op.add_column(
        "cases",
        sa.Column("stopped_early", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column("cases", sa.Column("invocations_run", sa.Integer(), nullable=True))
    op.add_column("cases", sa.Column("baseline", JSONB(), nullable=True))
    op.add_column("cases", sa.Column("regression_level", sa.String(16), nullable=True))
    op.add_column("cases", sa.Column("flaky", JSONB(), nullable=True))
    op.add_column("cases", sa.Column("quarantine", JSONB(), nullable=True))
    op.add_column("cases", sa.Column("reused_from", UUID(as_uuid=True), nullable=True))
    op.create_index("ix_cases_case_key", "cases", ["case_key"])
    op.add_column("gates", sa.Column("baseline", sa.String(300), nullable=True))
    op.add_column("gates", sa.Column("baseline_gate_id", UUID(as_uuid=True), nullable=True))
    op.add_column(
        "gates",
        sa.Column("changed_only", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_gates_project_id_created_at", "gates", ["project_id", "created_at"])
    op.add_column(
        "projects",
        sa.Column("verdict_rule", sa.String(16), nullable=False, server_default="threshold"),
    )
    op.create_table(
        "case_quarantines",
        sa.Column("id", UUID(as_uuid=True), nullable=False),
        sa.Column("project_id", UUID(as_uuid=True), nullable=False),
        sa.Column("case_key", sa.String(64), nullable=False),
        sa.Column("suite", sa.Text(), nullable=False),
        sa.Column("agent_name", sa.Text(), nullable=False),
        sa.Column("test_name", sa.Text(), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", UUID(as_uuid=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_case_quarantines_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_case_quarantines")),
        sa.UniqueConstraint("project_id", "case_key", name=op.f("uq_case_quarantines_project_id")),
    )


def downgrade() -> None:
    op.drop_table("case_quarantines")
    op.drop_column("projects", "verdict_rule")
    op.drop_index("ix_gates_project_id_created_at", table_name="gates")
    for column in ("changed_only", "baseline_gate_id", "baseline"):
        op.drop_column("gates", column)
    op.drop_index("ix_cases_case_key", table_name="cases")
    for column in (
        "reused_from",
        "quarantine",
        "flaky",
        "regression_level",
        "baseline",
        "invocations_run",
        "stopped_early",
        "definition_hash",
        "closure_hash",
        "case_key",
    ):
        op.drop_column("cases", column)

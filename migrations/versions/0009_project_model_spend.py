"""project model spend: a project's model calls, tokens and cost per budget window

Shared by every worker process's model gateway, so a project's budget (GATE_GATEWAY_PROJECT_*)
holds across workers: a call is charged here, atomically against the limits, before it is
forwarded, and its tokens and cost are added once it is answered. Rows go with their project.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "project_model_spend",
        sa.Column("project_id", sa.UUID(), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_project_model_spend_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("project_id", "window_start", name=op.f("pk_project_model_spend")),
    )


def downgrade() -> None:
    op.drop_table("project_model_spend")

"""gates.model_mode: force scripted, replay or live models for a gate

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gates", sa.Column("model_mode", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("gates", "model_mode")

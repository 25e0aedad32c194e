"""gates.sandbox: what ran a gate's cases

``{"backend", "runtime"}``: the sandbox backend (GATE_SANDBOX_BACKEND) and the OCI runtime of
its case containers (GATE_CASE_RUNTIME, or the engine's default), as the worker that started
the gate had them. NULL for a gate not started yet, and for gates started before this
revision.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gates", sa.Column("sandbox", JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("gates", "sandbox")

"""Live fidelity: a project's guardrail judge model, and the model mode a gate's agents ran in

``projects.guardrail_model``: the model that judges an agent's prompt_injection,
topic_restriction, system_prompt_leakage, data_exfiltration and relevance guardrails
(NULL: none, and those guardrails are skipped with a warning).

``gates.model_modes``: each LLM agent's model mode as the worker worked it out in validating
(``{"agent": "live"}``); ``gates.model_mode_reason``: why, when no mode was forced (e.g.
"no scripted model or recordings: live"). ``gates.model_mode`` stays the mode the submission
forced, or NULL.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("projects", sa.Column("guardrail_model", sa.String(200), nullable=True))
    op.add_column(
        "gates",
        sa.Column("model_modes", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    )
    op.add_column("gates", sa.Column("model_mode_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("gates", "model_mode_reason")
    op.drop_column("gates", "model_modes")
    op.drop_column("projects", "guardrail_model")

"""bounded run storage: shared values per run, stored bytes per run and per gate

A run's values that occur more than once (a tool's result, the run's output, the outbound
span's output) are stored once in runs.shared_values; runs.stored_bytes is the size of all
a run stores, and gates.result_bytes the sum over a gate's runs, which the per-project
quota on stored results adds up (GATE_MAX_RESULT_BYTES_PER_PROJECT). Runs stored before
this migration are measured from their JSON text, so the quota counts them too.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column(
            "shared_values",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            server_default="{}",
        ),
    )
    op.add_column(
        "runs", sa.Column("stored_bytes", sa.BigInteger(), nullable=False, server_default="0")
    )
    op.add_column(
        "gates", sa.Column("result_bytes", sa.BigInteger(), nullable=False, server_default="0")
    )
    op.execute(
        """
        UPDATE runs SET stored_bytes = octet_length(jsonb_build_object(
            'input', input, 'output', output, 'error', error,
            'failure_reason', failure_reason, 'failed_assertions', failed_assertions,
            'run_context', run_context, 'traces', traces)::text)
        """
    )
    op.execute(
        """
        UPDATE gates g SET result_bytes = s.total
          FROM (SELECT c.gate_id, sum(r.stored_bytes) AS total
                  FROM runs r JOIN cases c ON c.id = r.case_id
                 GROUP BY c.gate_id) s
         WHERE g.id = s.gate_id
        """
    )


def downgrade() -> None:
    op.drop_column("gates", "result_bytes")
    op.drop_column("runs", "stored_bytes")
    op.drop_column("runs", "shared_values")

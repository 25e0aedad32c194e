"""bundle chunks: a bundle's bytes in pieces, so no process holds a whole upload at once

bundles.data (one bytea of up to 25 MiB, built, sent and received whole) becomes rows of
bundle_chunks, each at most 512 KiB, which the API writes and a worker reads one at a time.
A bundle stored before this migration becomes its one chunk.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bundle_chunks",
        sa.Column(
            "sha256",
            sa.String(64),
            sa.ForeignKey("bundles.sha256", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.execute("INSERT INTO bundle_chunks (sha256, seq, data) SELECT sha256, 0, data FROM bundles")
    op.drop_column("bundles", "data")


def downgrade() -> None:
    op.add_column("bundles", sa.Column("data", sa.LargeBinary(), nullable=True))
    op.execute(
        "UPDATE bundles b SET data = (SELECT string_agg(c.data, ''::bytea ORDER BY c.seq) "
        "FROM bundle_chunks c WHERE c.sha256 = b.sha256)"
    )
    op.execute("UPDATE bundles SET data = ''::bytea WHERE data IS NULL")
    op.alter_column("bundles", "data", nullable=False)
    op.drop_table("bundle_chunks")

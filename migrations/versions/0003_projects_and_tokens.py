"""projects, tokens, secrets and audit: every gate belongs to a project

Existing gates move into the bootstrap project `default`.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("retention_days", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projects")),
        sa.UniqueConstraint("name", name=op.f("uq_projects_name")),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("project_id", sa.UUID(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("scopes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_api_tokens_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_api_tokens_token_sha256")),
    )
    op.create_index(op.f("ix_api_tokens_project_id"), "api_tokens", ["project_id"])
    op.create_table(
        "project_secrets",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("project_id", sa.UUID(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_project_secrets_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_project_secrets")),
        sa.UniqueConstraint("project_id", "name", name=op.f("uq_project_secrets_project_id")),
    )
    op.create_index(op.f("ix_project_secrets_project_id"), "project_secrets", ["project_id"])
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("project_id", sa.UUID(), nullable=True),
        sa.Column("token_id", sa.UUID(), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_audit_events_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    op.create_index(op.f("ix_audit_events_at"), "audit_events", ["at"])
    op.create_index(op.f("ix_audit_events_project_id"), "audit_events", ["project_id"])

    op.add_column("gates", sa.Column("project_id", sa.UUID(), nullable=True))
    conn = op.get_bind()
    if conn.execute(sa.text("SELECT EXISTS (SELECT 1 FROM gates)")).scalar():
        default_id = uuid.uuid4()
        conn.execute(
            sa.text(
                "INSERT INTO projects (id, name, retention_days, created_at) "
                "VALUES (:id, 'default', 30, now())"
            ),
            {"id": default_id},
        )
        conn.execute(sa.text("UPDATE gates SET project_id = :id"), {"id": default_id})
    op.alter_column("gates", "project_id", nullable=False)
    op.create_foreign_key(
        op.f("fk_gates_project_id_projects"),
        "gates",
        "projects",
        ["project_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_index(op.f("ix_gates_project_id"), "gates", ["project_id"])
    op.drop_constraint(op.f("uq_gates_idempotency_key"), "gates", type_="unique")
    op.create_unique_constraint(
        op.f("uq_gates_project_id"), "gates", ["project_id", "idempotency_key"]
    )


def downgrade() -> None:
    op.drop_constraint(op.f("uq_gates_project_id"), "gates", type_="unique")
    op.create_unique_constraint(op.f("uq_gates_idempotency_key"), "gates", ["idempotency_key"])
    op.drop_index(op.f("ix_gates_project_id"), table_name="gates")
    op.drop_constraint(op.f("fk_gates_project_id_projects"), "gates", type_="foreignkey")
    op.drop_column("gates", "project_id")
    op.drop_table("audit_events")
    op.drop_table("project_secrets")
    op.drop_table("api_tokens")
    op.drop_table("projects")

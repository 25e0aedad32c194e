"""gate_changed notifications say the gate's new revision and status

Migration 0004's notification carried the gate id alone, so every long-poll it woke asked
Postgres for the gate's revision and status before it knew whether to answer: two queries a
case for each pipeline waiting on a running gate. The payload is now
``'<gate id> <revision> <status>'`` (a deleted gate's is still its id alone), which is what
those queries read. A listener that finds only an id reads the gate as before.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHANNEL = "gate_changed"  # as in 0004 and gate_service.gates.notify


def _function(payload: str) -> str:
    return f"""
        CREATE OR REPLACE FUNCTION notify_gate_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                PERFORM pg_notify('{CHANNEL}', OLD.id::text);
                RETURN OLD;
            END IF;
            PERFORM pg_notify('{CHANNEL}', {payload});
            RETURN NEW;
        END
        $$
        """


def upgrade() -> None:
    op.execute(_function("NEW.id::text || ' ' || NEW.revision::text || ' ' || NEW.status::text"))


def downgrade() -> None:
    op.execute(_function("NEW.id::text"))

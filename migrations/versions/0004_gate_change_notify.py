"""notify gate_changed on every visible change of a gate, for long-polls

Every visible change of a gate (its own fields, a case, a run) bumps ``gates.revision`` in
the same transaction, so a trigger on that column is exact whichever process or code path
made the change (API, worker, retention, a hand-written UPDATE). Postgres delivers the
notification at commit and folds duplicates within one transaction, so a transaction that
bumps the revision several times sends one. A deleted gate notifies too, so its waiters
re-check and answer 404.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The channel gate_service.gates.notify listens on; the payload is the gate id.
CHANNEL = "gate_changed"


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION notify_gate_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                PERFORM pg_notify('{CHANNEL}', OLD.id::text);
                RETURN OLD;
            END IF;
            PERFORM pg_notify('{CHANNEL}', NEW.id::text);
            RETURN NEW;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER gates_notify_revision
        AFTER UPDATE OF revision ON gates
        FOR EACH ROW WHEN (NEW.revision IS DISTINCT FROM OLD.revision)
        EXECUTE FUNCTION notify_gate_changed()
        """
    )
    op.execute(
        """
        CREATE TRIGGER gates_notify_delete
        AFTER DELETE ON gates
        FOR EACH ROW EXECUTE FUNCTION notify_gate_changed()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS gates_notify_delete ON gates")
    op.execute("DROP TRIGGER IF EXISTS gates_notify_revision ON gates")
    op.execute("DROP FUNCTION IF EXISTS notify_gate_changed()")

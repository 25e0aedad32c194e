"""notify gate_jobs when a job may have become claimable, to wake idle workers

A job becomes claimable when it is queued (a new gate, or one handed back for a retry) and
another may when a running one ends (the per-project cap frees a place). Idle workers
LISTEN on the channel (gate_service.worker.wakeup) instead of waiting out their poll
interval. The payload is empty: Postgres folds the notifications of one transaction into
one, and a woken worker claims through the usual fair query whatever woke it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The channel gate_service.worker.wakeup listens on.
CHANNEL = "gate_jobs"


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION notify_gate_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', '');
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER jobs_notify_queued
        AFTER INSERT ON jobs
        FOR EACH ROW WHEN (NEW.state = 'queued')
        EXECUTE FUNCTION notify_gate_jobs()
        """
    )
    op.execute(
        """
        CREATE TRIGGER jobs_notify_state
        AFTER UPDATE OF state ON jobs
        FOR EACH ROW WHEN (
            NEW.state IS DISTINCT FROM OLD.state
            AND (NEW.state = 'queued' OR OLD.state = 'running')
        )
        EXECUTE FUNCTION notify_gate_jobs()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_state ON jobs")
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_queued ON jobs")
    op.execute("DROP FUNCTION IF EXISTS notify_gate_jobs()")

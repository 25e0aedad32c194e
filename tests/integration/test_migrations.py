"""The migrations build exactly the models' schema, and run both ways."""

import threading

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from gate_service import migrate
from gate_service.db import sqlalchemy_url
from gate_service.models import Base

TABLES = {
    "bundles", "gates", "jobs", "cases", "runs",
    "projects", "api_tokens", "project_secrets", "audit_events", "model_calls",
    "project_model_spend", "ui_sessions",
}  # fmt: skip


def tables(url: str) -> set[str]:
    engine = create_engine(sqlalchemy_url(url))
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    assert tables(empty_database_url) == TABLES
    migrate.downgrade(empty_database_url, "base")
    assert tables(empty_database_url) == set()
    migrate.upgrade(empty_database_url)
    assert tables(empty_database_url) == TABLES


def test_processes_starting_together_migrate_one_at_a_time(empty_database_url: str) -> None:
    # Without the advisory lock, two upgrades of an empty database race to create the same
    # tables and one fails with "already exists" (as compose's API and worker did).
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def upgrade() -> None:
        start.wait()
        try:
            migrate.upgrade(empty_database_url)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=upgrade) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert tables(empty_database_url) == TABLES


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
    finally:
        engine.dispose()
    assert diff == []

"""The migrations build exactly the models' schema, and run both ways."""

import threading

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from gate_service import migrate
from gate_service.db import sqlalchemy_url
from gate_service.models import Base

TABLES = {
    "bundles", "gates", "jobs", "cases", "runs",
    "projects", "api_tokens", "project_secrets", "audit_events", "model_calls",
    "project_model_spend", "ui_sessions", "bundle_chunks", "case_quarantines",
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


def test_a_bundle_stored_whole_becomes_its_chunks_and_back(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url, "0013")
    engine = create_engine(sqlalchemy_url(empty_database_url))
    data = bytes(range(256)) * 9
    insert_old = text(
        "INSERT INTO bundles (sha256, data, archive_format, size_bytes, code_bytes, "
        "fixture_bytes, created_at) VALUES ('ab', :d, 'tar.gz', :n, :n, 0, now())"
    )
    try:
        with engine.begin() as conn:
            conn.execute(insert_old, {"d": data, "n": len(data)})
        migrate.upgrade(empty_database_url)
        with engine.connect() as conn:
            chunks = conn.execute(text("SELECT seq, data FROM bundle_chunks")).all()
        assert [(seq, bytes(d)) for seq, d in chunks] == [(0, data)]
        with engine.begin() as conn:  # stored in pieces since: joined again on the way down
            conn.execute(text("UPDATE bundle_chunks SET data = :d"), {"d": data[:100]})
            conn.execute(text("INSERT INTO bundle_chunks VALUES ('ab', 1, :d)"), {"d": data[100:]})
        migrate.downgrade(empty_database_url, "0013")
        with engine.connect() as conn:
            assert bytes(conn.execute(text("SELECT data FROM bundles")).scalar_one()) == data
    finally:
        engine.dispose()

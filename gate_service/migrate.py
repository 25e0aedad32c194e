"""Run Alembic migrations from code (no ini file needed)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text

from gate_service.db import sqlalchemy_url
from gate_service.resources import migrations_dir

# An API and its workers all migrate at start, often at the same moment (compose starts them
# together): one transaction-scoped advisory lock makes the others wait, then find the schema
# at head, instead of racing to create the same tables.
MIGRATION_LOCK_KEY = 0x6761_7465_6D69  # "gatemi"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # Percent signs in passwords would otherwise be read as interpolation.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    cfg = alembic_config(url)
    engine = create_engine(sqlalchemy_url(url))
    try:
        # One transaction for the lock and every migration (PostgreSQL's DDL is transactional).
        with engine.begin() as connection:
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)

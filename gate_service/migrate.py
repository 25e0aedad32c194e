"""Run Alembic migrations from code (no ini file needed)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from gate_service.resources import migrations_dir


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # Percent signs in passwords would otherwise be read as interpolation.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)

"""Alembic environment: the URL comes from the caller's config or GATE_DATABASE_URL."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from gate_service.db import sqlalchemy_url
from gate_service.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url") or os.environ.get("GATE_DATABASE_URL")
if not url:
    raise SystemExit("set GATE_DATABASE_URL (or sqlalchemy.url) to migrate")

connection = config.attributes.get("connection")
if connection is not None:
    context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(sqlalchemy_url(url))
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=Base.metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()

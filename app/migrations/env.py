"""Alembic's environment, for Alembic's own commands (`scripts/new_migration.py`): runs on the
connection `app.migrations.alembic_config` hands it, configured as every upgrade is."""

from __future__ import annotations

from alembic import context

from app.migrations import context_options


def run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("run migrations through app.db.init_db or `tuneharness db upgrade`")
    context.configure(**context_options(connection))
    with context.begin_transaction():
        context.run_migrations()


run()

"""Alembic environment: one advisory lock so that several pods may run `db upgrade` at once.

No `logging.config.fileConfig` here (nor an alembic.ini to read): it would replace the handler that renders
every line as JSON (observability/logging.py), which the command configured before migrating."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

SCHEMA = "identity"
# Any constant works; it only has to differ from the application's other advisory locks.
MIGRATION_LOCK_KEY = "pin-identity:lock:db-upgrade"


def run_migrations_online() -> None:
    connectable = context.config.attributes["connectable"]
    with connectable.connect() as connection:
        connection.execute(
            text("SELECT pg_advisory_lock(hashtextextended(:key, 0))"), {"key": MIGRATION_LOCK_KEY}
        )
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        connection.commit()
        try:
            context.configure(
                connection=connection, version_table_schema=SCHEMA, transaction_per_migration=True
            )
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
        finally:
            connection.execute(
                text("SELECT pg_advisory_unlock(hashtextextended(:key, 0))"), {"key": MIGRATION_LOCK_KEY}
            )
            connection.commit()


run_migrations_online()

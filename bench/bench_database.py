"""What the benchmarks do to their PostgreSQL before a run: a fresh migrated database, a checkpoint."""

from __future__ import annotations

import psycopg
from psycopg import sql

from pin_identity.adapters.postgres import migrate


def fresh_database(admin_url: str, name: str) -> str:
    """A new database; earlier bench databases are dropped so that no autovacuum of theirs runs meanwhile."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for (old,) in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'bench\\_%'"
        ).fetchall():
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(old)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    migrate.upgrade(url)
    return url


def checkpoint(url: str) -> None:
    """Earlier writes are flushed before the clock starts."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")

"""Schema migrations: Alembic, driven programmatically so no alembic.ini has to be found on disk.

Alembic and SQLAlchemy are imported where a migration runs: they take 0.4 s to import, which every command
and worker start would pay otherwise, though most never migrate."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg.rows import scalar_row

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def _alembic_config(database_url: str) -> Config:
    from alembic.config import Config
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # The libpq URL goes to psycopg as is; SQLAlchemy only wraps the connection.
    config.attributes["connectable"] = create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(database_url), poolclass=NullPool
    )
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply every pending migration; a no-op when the schema is current."""
    from alembic import command

    command.upgrade(_alembic_config(database_url), revision)


def current_revision(database_url: str) -> str | None:
    with psycopg.connect(database_url, row_factory=scalar_row) as conn:
        if not conn.execute("SELECT to_regclass('identity.alembic_version') IS NOT NULL").fetchone():
            return None
        revision = conn.execute("SELECT version_num FROM identity.alembic_version").fetchone()
        return str(revision) if revision is not None else None


def head_revision() -> str:
    """The newest revision this package ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config("")).get_current_head()
    if head is None:
        raise RuntimeError("no migrations found")
    return head

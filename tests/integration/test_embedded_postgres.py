"""The embedded PostgreSQL runs with its settings; one that needs a restart never cuts a client off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pin_identity.adapters.postgres.embedded_postgres import (
    EMBEDDED_SETTINGS,
    ensure_embedded_postgres,
    restart_embedded_postgres,
    stop_embedded_postgres,
)


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    stop_embedded_postgres(tmp_path)


def _shown(url: str, name: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    assert row is not None
    return str(row[0])


def test_a_fresh_server_runs_with_every_embedded_setting(data_dir: Path) -> None:
    url = ensure_embedded_postgres(data_dir)
    assert {name: _shown(url, name) for name in EMBEDDED_SETTINGS} == EMBEDDED_SETTINGS


def test_a_restart_waits_until_no_other_client_is_connected(data_dir: Path) -> None:
    url = ensure_embedded_postgres(data_dir)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_buffers = '64MB'")
    restart_embedded_postgres(data_dir)
    assert _shown(url, "shared_buffers") == "64MB"

    with psycopg.connect(url, autocommit=True) as client:
        ensure_embedded_postgres(data_dir)
        assert client.execute("SELECT 1").fetchone() == (1,), "the client was cut off"
        assert _shown(url, "shared_buffers") == "64MB"  # set, waiting for a restart

    ensure_embedded_postgres(data_dir)  # alone now: restarts
    assert _shown(url, "shared_buffers") == EMBEDDED_SETTINGS["shared_buffers"]

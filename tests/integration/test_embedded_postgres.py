"""The embedded PostgreSQL runs with its settings; one that needs a restart never cuts a client off."""

from __future__ import annotations

import subprocess
import sys
import time
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
from tests.support import fresh_machine


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


_START_AT_ONCE = """
import sys, time
from pathlib import Path
from pin_identity.adapters.postgres.embedded_postgres import ensure_embedded_postgres, stop_embedded_postgres
data_dir, start_at = Path(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start_at - time.time()))
ensure_embedded_postgres(data_dir)
stop_embedded_postgres(data_dir)
"""


@pytest.mark.skipif(fresh_machine.can_make_one() is not None, reason=str(fresh_machine.can_make_one()))
def test_processes_starting_at_once_on_a_fresh_machine_all_start(tmp_path: Path) -> None:
    """The first start as root makes the wheel's OS user; three processes at the same moment (pytest's, or
    two commands) make it once between them, and each starts its server."""
    machine = fresh_machine.FreshMachine(tmp_path / "machine")
    data_dirs = [tmp_path / f"process-{n}" for n in range(3)]
    start_at = str(time.time() + 3)
    starts = [
        subprocess.Popen(
            machine.command([sys.executable, "-c", _START_AT_ONCE, str(data_dir), start_at]),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for data_dir in data_dirs
    ]
    try:
        outputs = [start.communicate(timeout=120)[0] for start in starts]
    finally:
        for data_dir in data_dirs:
            fresh_machine.stop_postmaster(data_dir / "postgres")

    ended = zip(starts, outputs, strict=True)
    failed = [output.strip().splitlines()[-1] for start, output in ended if start.returncode]
    assert failed == [], f"{len(failed)} of 3 processes failed to start PostgreSQL: {failed}"
    assert [call.status for call in machine.calls("useradd")] == [0]  # made once, by one process
    assert machine.knows_user()

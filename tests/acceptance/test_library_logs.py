"""Every line a worker writes is one JSON object, the libraries' own lines too: its database crashes under
it (the postmaster SIGKILLed), and what psycopg and its pool say about the lost connections must reach a
log shipper as whole JSON lines with their level and logger, not as plain-text fragments."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pin_identity.adapters.postgres import migrate
from pin_identity.adapters.postgres.embedded_postgres import ensure_embedded_postgres, stop_embedded_postgres
from tests.acceptance.test_cli import CLI
from tests.support.waiting import wait_until


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[Path]:
    """A server of the test's own (killing it must not touch the other tests' databases): its data dir.
    Once killed there is nothing to stop (its backends exit when they see their postmaster gone); a test
    that failed before killing it stops it."""
    data_dir = tmp_path / "own-postgres"
    migrate.upgrade(ensure_embedded_postgres(data_dir))
    yield data_dir
    with contextlib.suppress(Exception):  # pg_ctl refuses a killed server's stale postmaster.pid
        stop_embedded_postgres(data_dir)


def _kill_postmaster(data_dir: Path) -> None:
    pid = int((data_dir / "postgres" / "postmaster.pid").read_text().splitlines()[0])
    os.kill(pid, signal.SIGKILL)


def _as_json(line: str) -> dict[str, Any]:
    try:
        parsed = json.loads(line)
    except json.JSONDecodeError:
        parsed = None
    assert isinstance(parsed, dict), f"not one JSON object: {line!r}"
    return parsed


@pytest.mark.timeout(180)
def test_every_line_a_worker_writes_while_its_database_crashes_is_one_json_object(
    subprocess_env: dict[str, str], own_postgres: Path, tmp_path: Path
) -> None:
    env = {**subprocess_env, "PIN_IDENTITY_DATABASE_URL": ensure_embedded_postgres(own_postgres)}
    log = tmp_path / "worker.log"
    with log.open("w") as stderr:
        worker = subprocess.Popen(
            [*CLI, "worker", "--jobs", "access-fanout,outbox-relay"], env=env, stderr=stderr, stdout=stderr
        )
    try:
        wait_until(lambda: "outbox-relay-started" in log.read_text(), "the worker runs", timeout_s=60)
        _kill_postmaster(own_postgres)
        wait_until(lambda: "psycopg" in log.read_text(), "psycopg logged the lost database", timeout_s=90)
    finally:
        worker.terminate()  # its jobs may wait out the pool's connection timeout: what it wrote is enough
        try:
            worker.wait(timeout=5)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()

    lines = log.read_text().splitlines()
    records = [_as_json(line) for line in lines]
    from_psycopg = [record for record in records if str(record.get("logger", "")).startswith("psycopg")]
    assert from_psycopg, "psycopg's lines carry their logger"
    for record in from_psycopg:
        assert {"event", "level", "logger", "timestamp"} <= record.keys(), record
        assert record["level"] in {"warning", "error", "critical"}, record

"""`pin-identity embedded info` as a subprocess: where the embedded servers are, whether they run, and that
looking starts nothing."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pin_identity.adapters.kafka.distribution import KAFKA_VERSION
from pin_identity.adapters.kafka.embedded_kafka import ensure_embedded_kafka, port_open, stop_embedded_kafka
from pin_identity.adapters.postgres.embedded_postgres import ensure_embedded_postgres, stop_embedded_postgres
from tests.support.cli import run_cli, unconfigured_environment


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No URLs configured: the embedded servers under a data dir of this test's own."""
    return {**unconfigured_environment(), "PIN_IDENTITY_DATA_DIR": str(tmp_path / "data")}


def _info(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = run_cli(env, "embedded", "info", *args)
    assert result.returncode == 0, result.stderr
    return result


def _info_json(env: dict[str, str]) -> dict[str, Any]:
    document = json.loads(_info(env, "--json").stdout)
    assert isinstance(document, dict)
    return document


def test_nothing_started_yet_and_looking_starts_nothing(env: dict[str, str], tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    document = _info_json(env)
    assert document["dataDir"] == str(data_dir)
    assert document["postgres"] == {
        "software": "PostgreSQL",
        "url": None,
        "running": False,
        "pid": None,
        "inUse": True,
        "logFile": str(data_dir / "postgres" / "log"),
    }
    assert document["broker"] == {
        "software": f"Apache Kafka {KAFKA_VERSION}",
        "bootstrapServers": None,
        "running": False,
        "pid": None,
        "inUse": True,
        "logFile": str(data_dir / "kafka" / "broker.log"),
    }
    assert _info(env).stdout.splitlines() == [
        f"data dir  {data_dir}",
        "postgres  not running (the next command that needs it starts it)",
        "broker    not running (the next command that needs it starts it)",
    ]
    assert not data_dir.exists()


def test_a_configured_url_marks_the_embedded_server_unused(env: dict[str, str]) -> None:
    env = {**env, "PIN_IDENTITY_DATABASE_URL": "postgresql://identity@db.internal/identity"}
    document = _info_json(env)
    assert document["postgres"]["inUse"] is False
    assert document["broker"]["inUse"] is True
    assert "not used: PIN_IDENTITY_DATABASE_URL is set" in _info(env).stdout


@pytest.fixture
def running_servers(tmp_path: Path) -> Iterator[tuple[str, str]]:
    data_dir = tmp_path / "data"
    try:
        yield ensure_embedded_postgres(data_dir), ensure_embedded_kafka(data_dir)
    finally:
        stop_embedded_kafka(data_dir)
        stop_embedded_postgres(data_dir)


@pytest.mark.timeout(180)
def test_running_servers_are_reachable_at_the_printed_addresses(
    env: dict[str, str], running_servers: tuple[str, str]
) -> None:
    url, bootstrap_servers = running_servers
    document = _info_json(env)
    assert document["postgres"]["url"] == url
    assert document["postgres"]["running"] is True
    assert document["broker"] == {
        **document["broker"],
        "bootstrapServers": bootstrap_servers,
        "running": True,
    }
    with psycopg.connect(document["postgres"]["url"]) as conn:  # what `psql <url>` does
        assert conn.execute("SELECT current_database()").fetchone() == ("pin_identity",)
    assert port_open(int(bootstrap_servers.rsplit(":", 1)[1]))
    text = _info(env).stdout
    assert f"psql '{url}'" in text
    assert f"kcat -b {bootstrap_servers} -L" in text

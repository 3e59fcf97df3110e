"""With no URLs configured, commands start the embedded PostgreSQL and broker, find them again, stop them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pin_identity.adapters.kafka.embedded_kafka import is_broker
from tests.support.cli import run_cli, unconfigured_environment


@pytest.mark.timeout(240)
def test_commands_start_reuse_and_stop_the_embedded_servers(tmp_path: Path) -> None:
    env = unconfigured_environment()
    env.update({"PIN_IDENTITY_DATA_DIR": str(tmp_path / "data"), "PIN_IDENTITY_LOG_FORMAT": "json"})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        result = run_cli(env, *args, timeout=120)
        assert result.returncode == 0, result.stderr
        return result

    broker_state = tmp_path / "data" / "kafka" / "broker.json"
    try:
        cli("db", "upgrade")
        created = json.loads(cli("kafka", "ensure-topics", "--json").stdout)["created"]
        assert sorted(created) == [
            "pin.identity.access.v1",
            "pin.identity.companies.v1",
            "pin.identity.users.v1",
        ]
        first_broker = json.loads(broker_state.read_text())
        assert is_broker(first_broker["pid"])
        # The next command finds both servers again: the schema is there and the topics too.
        assert json.loads(cli("kafka", "ensure-topics", "--json").stdout) == {"created": []}
        assert json.loads(broker_state.read_text()) == first_broker
        listed = cli("fanout", "list", "--json")
        assert json.loads(listed.stdout) == []
    finally:
        stopped = _stop(env)
    assert stopped.stdout.strip() == "broker stopped; postgres stopped"
    assert not (tmp_path / "data" / "postgres" / "postmaster.pid").exists()
    assert not is_broker(first_broker["pid"])
    try:  # started again on the same data dir: the broker's log directory kept the topics
        assert json.loads(cli("kafka", "ensure-topics", "--json").stdout) == {"created": []}
        assert is_broker(json.loads(broker_state.read_text())["pid"])
    finally:
        _stop(env)


def _stop(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(env, "embedded", "stop")

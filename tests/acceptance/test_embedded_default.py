"""With no URLs configured, commands start the embedded PostgreSQL and broker, find them again, stop them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "pin_identity.entrypoints.cli"]


@pytest.mark.timeout(180)
def test_commands_start_reuse_and_stop_the_embedded_servers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIN_IDENTITY_")}
    env.update({"PIN_IDENTITY_DATA_DIR": str(tmp_path / "data"), "PIN_IDENTITY_LOG_FORMAT": "json"})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stderr
        return result

    try:
        cli("db", "upgrade")
        broker_state = tmp_path / "data" / "kafka" / "broker.json"
        created = json.loads(cli("kafka", "ensure-topics", "--json").stdout)["created"]
        assert sorted(created) == [
            "pin.identity.access.v1",
            "pin.identity.companies.v1",
            "pin.identity.users.v1",
        ]
        first_broker = json.loads(broker_state.read_text())
        # The next command finds both servers again: the schema is there and the topics too.
        assert json.loads(cli("kafka", "ensure-topics", "--json").stdout) == {"created": []}
        assert json.loads(broker_state.read_text()) == first_broker
        listed = cli("fanout", "list", "--json")
        assert json.loads(listed.stdout) == []
    finally:
        stopped = subprocess.run(
            [*CLI, "embedded", "stop"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
    assert stopped.stdout.strip() == "broker stopped; postgres stopped"
    assert not (tmp_path / "data" / "postgres" / "postmaster.pid").exists()
    assert (
        not Path(f"/proc/{first_broker['pid']}").exists()
        or b"tansu" not in Path(f"/proc/{first_broker['pid']}/cmdline").read_bytes()
    )

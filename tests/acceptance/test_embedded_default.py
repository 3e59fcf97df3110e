"""With no URLs configured, commands start the embedded PostgreSQL and broker, find them again, stop them."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pin_identity.adapters.kafka.embedded_kafka import is_broker
from tests.support import fresh_machine
from tests.support.cli import CLI, run_cli, unconfigured_environment


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
        assert json.loads(cli("kafka", "ensure-topics", "--json").stdout) == {"created": [], "raised": []}
        assert json.loads(broker_state.read_text()) == first_broker
        listed = cli("fanout", "list", "--json")
        assert json.loads(listed.stdout) == []
    finally:
        stopped = _stop(env)
    assert stopped.stdout.strip() == "broker stopped; postgres stopped"
    assert not (tmp_path / "data" / "postgres" / "postmaster.pid").exists()
    assert not is_broker(first_broker["pid"])
    try:  # started again on the same data dir: the broker's log directory kept the topics
        assert json.loads(cli("kafka", "ensure-topics", "--json").stdout) == {"created": [], "raised": []}
        assert is_broker(json.loads(broker_state.read_text())["pid"])
    finally:
        _stop(env)


def _stop(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(env, "embedded", "stop")


def _first_commands(start_at: str) -> str:
    """Wait for the moment both start at, then what a newcomer runs first: the schema, then the topics."""
    wait = [sys.executable, "-c", "import sys, time; time.sleep(max(0.0, float(sys.argv[1]) - time.time()))"]
    steps = [[*wait, start_at], [*CLI, "db", "upgrade"], [*CLI, "kafka", "ensure-topics"]]
    return " && ".join(shlex.join(step) for step in steps)


@pytest.mark.timeout(240)
@pytest.mark.skipif(fresh_machine.can_make_one() is not None, reason=str(fresh_machine.can_make_one()))
def test_two_commands_started_at_once_on_a_fresh_machine_set_it_up_once(tmp_path: Path) -> None:
    """A fresh machine (no OS user for PostgreSQL, an empty cache): two commands at the same moment, each on a
    data dir of its own, make the OS user once and fetch the Kafka release once between them, and both
    succeed."""
    machine = fresh_machine.FreshMachine(tmp_path / "machine")
    env = unconfigured_environment()
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    data_dirs = [tmp_path / f"data-{n}" for n in range(2)]
    start_at = str(time.time() + 3)
    commands = [
        subprocess.Popen(
            machine.command(["sh", "-c", _first_commands(start_at)]),
            env={**env, "PIN_IDENTITY_DATA_DIR": str(data_dir)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for data_dir in data_dirs
    ]
    try:
        outputs = [command.communicate(timeout=200)[0] for command in commands]
    finally:
        for data_dir in data_dirs:
            subprocess.run(
                machine.command([*CLI, "embedded", "stop"]),
                env={**env, "PIN_IDENTITY_DATA_DIR": str(data_dir)},
                capture_output=True,
                timeout=60,
                check=False,
            )
            fresh_machine.stop_postmaster(data_dir / "postgres")

    assert [command.returncode for command in commands] == [0, 0], outputs
    assert [call.status for call in machine.calls("useradd")] == [0]
    assert [call.status for call in machine.calls("mvn")] == [0]

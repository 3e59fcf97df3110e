"""The `pin-identity` command as a subprocess, the way operators and deployments run it."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from pin_identity import __version__
from pin_identity.composition.stores import Stores
from tests.support import seed
from tests.support.cli import CLI, launch_worker, run_cli
from tests.support.kafka_tap import EventTap


@pytest.mark.parametrize(
    "args",
    [
        ("db", "upgrade", "--bogus"),
        ("no-such-command",),
        ("worker", "--jobs", "nope"),
        ("roles", "set-permissions", "not-a-uuid", "x"),
    ],
)
def test_bad_input_exits_2_with_one_readable_line(
    subprocess_env: dict[str, str], args: tuple[str, ...]
) -> None:
    result = run_cli(subprocess_env, *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr


def test_bad_configuration_exits_2_naming_the_variable(subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "PIN_IDENTITY_FANOUT_BATCH_SIZE": "lots"}
    result = run_cli(env, "db", "upgrade")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: PIN_IDENTITY_FANOUT_BATCH_SIZE:")


def test_unreachable_database_exits_2(subprocess_env: dict[str, str]) -> None:
    env = {
        **subprocess_env,
        "PIN_IDENTITY_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2",
    }
    result = run_cli(env, "roles", "set-permissions", "00000000-0000-4000-8000-000000000001", "x")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: PIN_IDENTITY_DATABASE_URL:")
    assert len(result.stderr.strip().splitlines()) == 1


def test_upgrade_then_set_permissions_then_relay_publishes(
    subprocess_env: dict[str, str], stores: Stores, tap: EventTap
) -> None:
    assert run_cli(subprocess_env, "db", "upgrade").returncode == 0
    company_id = seed.company(stores.identity_transactions)
    role_id = seed.role(stores.identity_transactions, company_id)
    user_id = seed.user(stores.identity_transactions, company_id)
    seed.grant(stores.identity_transactions, user_id, role_id, company_id)

    changed = run_cli(
        subprocess_env, "roles", "set-permissions", str(role_id), "deals.read", "deals.approve", "--json"
    )
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout) == {
        "roleId": str(role_id),
        "roleVersion": 2,
        "path": "inline",
        "usersNotifiedInline": 1,
        "taskId": None,
    }
    relay = run_cli(subprocess_env, "worker", "--jobs", "outbox-relay", "--once")
    assert relay.returncode == 0, relay.stderr

    [event] = tap.wait_for(
        lambda e: e.key == str(user_id) and e.payload.get("changeReason") == "RolePermissionsChanged", 1
    )
    assert event.payload["version"] == 2


def test_sigterm_stops_the_worker_gracefully(subprocess_env: dict[str, str], stores: Stores) -> None:
    worker = subprocess.Popen(
        [*CLI, "worker", "--jobs", "outbox-relay"], env=subprocess_env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert worker.stderr is not None
        for line in worker.stderr:
            if "outbox-relay-started" in line:
                break
        seed.company(stores.identity_transactions)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        logged = [json.loads(line) for line in worker.stderr.read().splitlines() if line.startswith("{")]
    finally:
        worker.kill()
    assert {"event": "worker-stopped", "graceful": True}.items() <= logged[-1].items()


def test_worker_serves_metrics_health_and_readiness(
    subprocess_env: dict[str, str], stores: Stores, tmp_path: Path
) -> None:
    worker = launch_worker(subprocess_env, "outbox-relay,access-fanout", tmp_path / "worker.log")
    try:
        base = worker.base
        health = httpx.get(f"{base}/healthz", timeout=5)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert (ready.status_code, ready.json()) == (
            200,
            {"status": "ready", "warnings": []},
        )  # `serve`'s document
        seed.company(stores.identity_transactions)
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
        for name in (
            "identity_outbox_backlog",
            "identity_access_fanout_queue_backlog",
            "identity_access_fanout_tasks_total",
            "identity_access_fanout_last_success_timestamp_seconds",
        ):
            assert name in metrics
        assert httpx.get(f"{base}/nope", timeout=5).status_code == 404
    finally:
        assert worker.stop(timeout_s=30) == 0


def test_version(subprocess_env: dict[str, str]) -> None:
    result = run_cli(subprocess_env, "--version")
    assert (result.returncode, result.stdout) == (0, f"pin-identity {__version__}\n")

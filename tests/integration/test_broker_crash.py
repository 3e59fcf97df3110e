"""The broker crashes (SIGKILL, no shutdown) and comes back on the same log directory: half-way through a
200,000-user fan-out, and half-way through the relay publishing a bootstrap's events. Nothing is lost, each
key's events stay in order, and the access audit finds nothing drifted or missing. While the broker is down
past the relay's delivery timeout, the worker's /readyz says so, the rows wait in the outbox, and they flow
again once it is back, without a restart of the worker."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import psycopg
import pytest

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.composition.stores import Stores
from pin_identity.domain.events import ACCESS_TOPIC, PUBLISHED_TOPICS, USERS_TOPIC
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.import_run import ImportMode, ImportRequest, RunStatus
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from pin_identity.simulation.simulated_talent import SimulatedTalentApi, generate_dataset
from tests.support import seed
from tests.support.brokers import RestartableBroker
from tests.support.cli import WorkerProcess, launch_worker, run_cli
from tests.support.kafka_tap import ConsumedEvent, EventTap, assert_versions_never_go_back
from tests.support.relay import outbox_count
from tests.support.talent_import import import_container, run_to_end
from tests.support.waiting import wait_until

USERS = 200_000
# The relay gives up on a delivery after 5 s (production: a minute), so the outage outlasts it in seconds.
DELIVERY_TIMEOUT_S = 5
SHORT_DELIVERY = json.dumps(
    {
        "message.timeout.ms": str(DELIVERY_TIMEOUT_S * 1000),
        "request.timeout.ms": "2000",
        "reconnect.backoff.max.ms": "200",
    }
)


@pytest.fixture
def crashable(tmp_path: Path) -> Iterator[RestartableBroker]:
    broker = RestartableBroker.started(tmp_path / "broker", PUBLISHED_TOPICS)
    yield broker
    broker.stop()


@pytest.fixture
def env(subprocess_env: dict[str, str], crashable: RestartableBroker) -> dict[str, str]:
    return {
        **subprocess_env,
        "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": crashable.bootstrap,
        "PIN_IDENTITY_KAFKA_CONFIG": SHORT_DELIVERY,
        "PIN_IDENTITY_FANOUT_BATCH_SIZE": "2000",
    }


def _task(database_url: str) -> tuple[str, int]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT status, processed_count FROM identity.access_fanout_tasks"
            " ORDER BY role_version DESC LIMIT 1"
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _published(database_url: str) -> bool:
    return _task(database_url)[0] == "Completed" and outbox_count(database_url) == 0


def _whole_topic(bootstrap: str, topic: str) -> list[ConsumedEvent]:
    tap = EventTap(bootstrap, [topic], from_beginning=True)
    try:
        return tap.read_to_end(lambda e: True, timeout_s=180)  # 400,000 events and more
    finally:
        tap.close()


def _audit(env: dict[str, str]) -> dict[str, object]:
    done = run_cli(env, "access", "audit", "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, object] = json.loads(done.stdout)
    return report


def _outage_felt(worker: WorkerProcess, database_url: str, killed_at: float) -> None:
    """Down longer than the delivery timeout: /readyz says so, and the events wait in the outbox."""
    wait_until(lambda: worker.ready() == 503, "the worker's /readyz reports the broker", timeout_s=30)
    outlasted = killed_at + DELIVERY_TIMEOUT_S + 2
    wait_until(lambda: time.monotonic() > outlasted, "the outage outlasts the delivery timeout")
    assert worker.ready() == 503
    assert outbox_count(database_url) > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_broker_killed_half_way_through_a_200000_user_fanout_loses_nothing(
    container: Container,
    stores: Stores,
    env: dict[str, str],
    crashable: RestartableBroker,
    database_url: str,
    tmp_path: Path,
) -> None:
    _, role, users = seed.bulk_held_role(stores.identity_transactions, database_url, USERS)
    worker = launch_worker(env, "access-fanout,outbox-relay", tmp_path / "worker.log")
    try:
        _set_permissions(container, role, ["deals.read"])  # version 2
        wait_until(
            lambda: _task(database_url)[1] >= USERS // 2, "half of the role is fanned out", timeout_s=240
        )
        crashable.kill()
        _outage_felt(worker, database_url, killed_at=time.monotonic())
        crashable.start()
        wait_until(lambda: _published(database_url), "version 2 is published after the crash", timeout_s=300)
        wait_until(lambda: worker.ready() == 200, "the worker is ready again")
        _set_permissions(container, role, ["deals.read", "deals.approve"])  # version 3
        wait_until(lambda: _published(database_url), "version 3 is published", timeout_s=300)
    finally:
        assert worker.stop() == 0
    versions = assert_versions_never_go_back(
        (event.key, event.payload["version"])
        for event in _whole_topic(crashable.bootstrap, ACCESS_TOPIC)
        if event.payload["changedRoleId"] == str(role)
    )
    assert versions.keys() == {str(user) for user in users}, "a user's events were lost"
    assert all(seen[-1] == 3 and 2 in seen for seen in versions.values())
    audit = _audit(env)
    assert (audit["drifted"], audit["missing"], audit["users"]) == (0, 0, USERS)


def _set_permissions(container: Container, role: UUID, permissions: list[str]) -> None:
    identity_changes.set_role_permissions(
        container.stores.identity_transactions,
        Context.fresh(SYSTEM_CLOCK),
        role_id=role,
        permissions=permissions,
        policy=FanOutPolicy(inline_threshold=0),
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_broker_killed_half_way_through_publishing_a_bootstrap_loses_nothing(
    container: Container, env: dict[str, str], crashable: RestartableBroker, database_url: str, tmp_path: Path
) -> None:
    dataset = generate_dataset(100, 20_000, seed=23)
    with (
        SimulatedTalentApi(dataset) as api,
        import_container(
            container.settings, talent_api_url=api.url, talent_api_token="talent-token"
        ) as importer,
    ):
        run = run_to_end(importer, ImportRequest(ImportMode.API_PULL, page_size=1000))
    assert run.status is RunStatus.COMPLETED
    waiting = outbox_count(database_url)  # every UserUpserted, CompanyUpserted and UserAccessChanged
    worker = launch_worker(env, "outbox-relay", tmp_path / "relay.log")
    try:
        # Frozen once a part is published, the relay is mid-way when the broker dies under it.
        wait_until(lambda: outbox_count(database_url) < waiting * 0.8, "a part is published", timeout_s=60)
        worker.process.send_signal(signal.SIGSTOP)
        assert outbox_count(database_url) > 0, "the relay must be stopped mid-way"
        crashable.kill()
        killed_at = time.monotonic()
        worker.process.send_signal(signal.SIGCONT)
        _outage_felt(worker, database_url, killed_at)
        crashable.start()
        wait_until(lambda: outbox_count(database_url) == 0, "the rest is published", timeout_s=180)
    finally:
        assert worker.stop() == 0
    upserted = assert_versions_never_go_back(
        (event.payload["externalTalentUserId"], event.payload["replicaVersion"])
        for event in _whole_topic(crashable.bootstrap, USERS_TOPIC)
    )
    assert upserted.keys() == {user["userId"] for user in dataset.users}, "UserUpserted events were lost"
    audit = _audit(env)
    assert (audit["drifted"], audit["missing"], audit["users"]) == (0, 0, len(dataset.users))

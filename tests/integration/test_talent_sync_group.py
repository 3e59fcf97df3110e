"""talent-sync as a real consumer group: three `worker --jobs talent-sync` processes share Talent's topics,
one is SIGKILLed while it applies, a fourth joins later. Every record is applied and nothing older overwrites
anything newer (offsets are committed only after their batch committed in the database), the group's lag read
from its committed offsets returns to 0, and so does each live worker's lag gauge."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.simulation.simulated_talent import (
    TalentDataset,
    create_talent_topics,
    generate_dataset,
    produce_to_topics,
)
from tests.support import talent
from tests.support.cli import WorkerProcess, launch_worker
from tests.support.talent import TalentTopics
from tests.support.waiting import wait_until

PARTITIONS = 6


def _lag_gauge(worker: WorkerProcess) -> float:
    text = httpx.get(f"{worker.base}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("talent_sync_consumer_lag{")
    )


def _renamed(dataset: TalentDataset) -> TalentDataset:
    return TalentDataset(
        [],
        [
            {**user, "version": user["version"] + 1, "lastName": f"{user['lastName']}-2"}
            for user in dataset.users
        ],
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_group_of_workers_applies_every_record_though_one_is_killed_and_another_joins(
    settings: Settings, broker: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    topics = TalentTopics.fresh()
    config = {"bootstrap.servers": broker}
    create_talent_topics(config, PARTITIONS, tenants_topic=topics.tenants, users_topic=topics.users)
    first = generate_dataset(60, 12_000, seed=41)
    produce_to_topics(config, first, tenants_topic=topics.tenants, users_topic=topics.users)
    produce_to_topics(config, _renamed(first), tenants_topic=topics.tenants, users_topic=topics.users)
    env = {
        **subprocess_env,
        "PIN_IDENTITY_TALENT_TENANTS_TOPIC": topics.tenants,
        "PIN_IDENTITY_TALENT_USERS_TOPIC": topics.users,
        "PIN_IDENTITY_TALENT_SYNC_GROUP": topics.group,
    }
    container = Container(
        settings.model_copy(
            update={
                "talent_tenants_topic": topics.tenants,
                "talent_users_topic": topics.users,
                "talent_sync_group": topics.group,
            }
        )
    )
    records = len(first.tenants) + 2 * len(first.users)
    newest = {user["userId"]: user["version"] + 1 for user in first.users}

    def group_lag() -> int | None:
        return container.use_cases.health.consumer_lag().total

    workers = [launch_worker(env, "talent-sync", tmp_path / f"worker-{n}.log") for n in range(3)]
    try:
        # Killed once the group committed a part and has more to apply: mid-way, with a batch in hand.
        wait_until(
            lambda: (lag := group_lag()) is not None and lag < records * 0.8,
            "the group applies",
            timeout_s=120,
        )
        assert (group_lag() or 0) > 0, "the kill must land before the end"
        workers[0].process.send_signal(signal.SIGKILL)
        workers[0].process.wait(10)
        workers.append(launch_worker(env, "talent-sync", tmp_path / "worker-3.log"))
        wait_until(lambda: group_lag() == 0, "the group's committed offsets reach the end", timeout_s=240)
        wait_until(
            lambda: sum(_lag_gauge(worker) for worker in workers[1:]) == 0,
            "each live worker's lag gauge reads 0",
            timeout_s=30,
        )
        # A user whose tenant another member had not applied yet waits in the consumer's quarantine for its
        # retry (committed, not lost): the live members apply it within seconds of the tenant.
        # A user deferred again and again while its tenant's partition moved to another member waits out its
        # back-off (doubling): every user at its newest version, not merely there, is the end.
        wait_until(
            lambda: not _behind(talent.replica_state(container)["users"], newest),
            "the users deferred for their tenant are applied",
            timeout_s=240,
        )
    finally:
        for worker in workers:
            if worker.process.poll() is None:  # all but the one killed
                assert worker.stop() == 0
    users = talent.replica_state(container)["users"]
    container.close()
    assert len(users) == len(newest), "a record was never applied"
    behind = _behind(users, newest)
    assert behind == [], f"{len(behind)} users hold an older version, e.g. {behind[:1]}"


def _behind(users: list[tuple[Any, ...]], newest: dict[str, int]) -> list[tuple[Any, ...]]:
    """(external id, ..., last name at 7, ..., replica version at 11): the users not at the second version,
    or missing."""
    if len(users) != len(newest):
        return [("missing", len(newest) - len(users))]
    return [user for user in users if user[11] != newest[user[0]] or not user[7].endswith("-2")]

"""Compaction, as a real broker runs it: after the cleaner removed every superseded record, a new consumer
reading from offset 0 still ends with the truth. The access topic: a fresh cache (the reference consumer)
holds each user's current assignments and the audit finds nothing drifted. Talent's topics, holding a deleted
tenant's tombstone: TopicReplay builds the same replica as the continuous consumer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.access_cache import UserAccessCache
from pin_identity.domain.events import ACCESS_TOPIC, COMPANIES_TOPIC, USERS_TOPIC
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.import_run import ImportMode, RunStatus
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from pin_identity.simulation.simulated_talent import (
    SimulatedTalentApi,
    TalentDataset,
    generate_dataset,
    produce_to_topics,
)
from tests.support import seed, talent
from tests.support.brokers import RestartableBroker, create_compacting_topics, roll_segments
from tests.support.convergence import active_assignments
from tests.support.kafka_tap import ConsumedEvent, EventTap
from tests.support.relay import publish_outbox
from tests.support.talent import TalentTopics
from tests.support.talent_import import TalentWorld
from tests.support.waiting import wait_until

ROUNDS = 6


def _whole_topic(bootstrap: str, topic: str) -> list[ConsumedEvent]:
    tap = EventTap(bootstrap, [topic], from_beginning=True)
    try:
        return tap.read_to_end(lambda e: True)
    finally:
        tap.close()


def _compacted(bootstrap: str, topic: str, written: int) -> Callable[[], bool]:
    """The cleaner ran: of `written` records, every key written at least twice, at most 60 % are left."""
    return lambda: len(_whole_topic(bootstrap, topic)) <= written * 0.6


@pytest.fixture
def compacting(tmp_path: Path) -> Iterator[RestartableBroker]:
    broker = RestartableBroker.started(tmp_path / "broker")
    create_compacting_topics(broker.bootstrap, [ACCESS_TOPIC], partitions=3)
    ensure_topics({"bootstrap.servers": broker.bootstrap}, [COMPANIES_TOPIC, USERS_TOPIC], TopicLayout(3, 1))
    yield broker
    broker.stop()


@pytest.mark.slow
def test_a_new_cache_reading_the_compacted_access_topic_from_offset_0_holds_every_users_truth(
    settings: Settings, database_url: str, compacting: RestartableBroker
) -> None:
    container = Container(settings.model_copy(update={"kafka_bootstrap_servers": compacting.bootstrap}))
    try:
        company = seed.company(container.stores.identity_transactions)
        role, other = (
            seed.role(container.stores.identity_transactions, company),
            seed.role(container.stores.identity_transactions, company, "viewer"),
        )
        users = [seed.user(container.stores.identity_transactions, company) for _ in range(40)]
        grants = {
            user: seed.grant(container.stores.identity_transactions, user, role, company) for user in users
        }
        for round_ in range(ROUNDS):  # each round a new version of every user's snapshot
            seed.change_permissions(
                container.stores.identity_transactions,
                role,
                [f"p{round_}"],
                FanOutPolicy(inline_threshold=200),
            )
            publish_outbox(container)
            roll_segments(compacting.bootstrap, [ACCESS_TOPIC], 3)  # each round in segments of its own
        for user in users[::3]:  # the last word for some: a revocation, a grant of another role
            identity_changes.revoke_role_assignment(
                container.stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), grants[user]
            )
        for user in users[1::3]:
            seed.grant(container.stores.identity_transactions, user, other, company)
        publish_outbox(container)
        roll_segments(compacting.bootstrap, [ACCESS_TOPIC], 3)
        written = len(users) * (ROUNDS + 1) + len(users[::3]) + len(users[1::3])
        wait_until(_compacted(compacting.bootstrap, ACCESS_TOPIC, written), "the cleaner ran", timeout_s=60)
        cache = UserAccessCache()
        for event in _whole_topic(compacting.bootstrap, ACCESS_TOPIC):
            if event.body:  # not a tombstone
                cache.apply(event.payload)
        truth = active_assignments(database_url, users)
        cached = {user: sorted(a["assignmentId"] for a in held) for user, held in cache.assignments.items()}
        assert cached == {str(user): truth.get(str(user), []) for user in users}
        audit = container.use_cases.access_audit(lambda done, total: None)
        assert (audit.drifted, audit.missing, audit.users) == (0, 0, len(users))
    finally:
        container.close()


@pytest.mark.slow
def test_topic_replay_of_compacted_talent_topics_with_a_tombstone_builds_the_consumers_replica(
    settings: Settings, talent_api: SimulatedTalentApi, broker: str, another_database: Callable[[], str]
) -> None:
    topics = TalentTopics.fresh()
    # Tombstones stay a day, as on Talent's cluster: the deleted tenant's tombstone is there to replay.
    create_compacting_topics(broker, [topics.tenants, topics.users], 3, tombstones_kept_ms=86_400_000)
    first = generate_dataset(8, 200, seed=31)
    later = _newer_versions(first)
    deleted = first.tenants[-1]["tenantId"]
    config = {"bootstrap.servers": broker}
    produce_to_topics(config, first, tenants_topic=topics.tenants, users_topic=topics.users)
    roll_segments(broker, [topics.tenants, topics.users], 3)
    produce_to_topics(
        config,
        later,
        tenants_topic=topics.tenants,
        users_topic=topics.users,
        tombstones=[(topics.tenants, deleted)],
    )
    roll_segments(broker, [topics.tenants, topics.users], 3)
    written = len(first.users) + len(later.users)
    wait_until(_compacted(broker, topics.users, written), "the cleaner ran", timeout_s=60)
    assert any(e.key == deleted and not e.body for e in _whole_topic(broker, topics.tenants)), "no tombstone"

    replay = TalentWorld(ImportMode.TOPIC_REPLAY, _on(settings, another_database()), talent_api, topics)
    assert replay.run(page_size=50).status is RunStatus.COMPLETED
    replayed = talent.replica_state(replay.container)
    replay.close()
    consumer = TalentWorld(ImportMode.TOPIC_REPLAY, _on(settings, another_database()), talent_api, topics)
    fresh_group = TalentTopics(topics.tenants, topics.users, f"{topics.group}-consumer")

    def consumed_everything() -> bool:
        """Caught up, and no user left waiting: a user read before its tenant is deferred and retried a
        second later, which a run that found the topics read stops short of."""
        talent.run_until_caught_up(talent.sync_job(consumer.container, fresh_group))
        return len(talent.replica_state(consumer.container)["users"]) >= len(replayed["users"])

    wait_until(consumed_everything, "the consumer applies the users deferred for their tenant", timeout_s=90)
    consumed = talent.replica_state(consumer.container)
    consumer.close()
    assert replayed == consumed
    assert len(replayed["users"]) >= len(first.users) - len(first.users) // 8  # not an empty picture


def _on(settings: Settings, database_url: str) -> Settings:
    return settings.model_copy(update={"database_url": database_url})


def _newer_versions(dataset: TalentDataset) -> TalentDataset:
    """A second version of every user (renamed), and of every tenant but the last, which is deleted."""
    users = [
        {**user, "version": user["version"] + 1, "lastName": f"{user['lastName']}-2"}
        for user in dataset.users
    ]
    tenants = [{**tenant, "version": tenant["version"] + 1} for tenant in dataset.tenants[:-1]]
    return TalentDataset(tenants, users)

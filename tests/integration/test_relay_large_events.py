"""Heavy users' access snapshots: a user of 10,000 assignments is published; where the topic takes less, only
the event that is too large is dead-lettered, alone, and never an ordinary user's beside it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

from pin_identity.adapters.kafka.publisher import KafkaEventPublisher
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.events import ACCESS_TOPIC, PUBLISHED_TOPICS
from pin_identity.domain.fanout_policy import FanOutPolicy
from tests.support import seed
from tests.support.clocks import ManualClock
from tests.support.kafka_tap import EventTap
from tests.support.relay import read_rows
from tests.support.waiting import wait_until

ORDINARY = 20


def _role_with_a_heavy_holder(
    container: Container, database_url: str, assignments: int
) -> tuple[uuid.UUID, uuid.UUID]:
    """A role held by ORDINARY users once each and by one user `assignments` times (as many projects):
    (the role, the heavy user)."""
    company_id, role_id, _ = seed.bulk_held_role(
        container.stores.identity_transactions, database_url, ORDINARY
    )
    heavy = uuid.uuid4()
    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        seed.copy_users(cur, company_id, [heavy])
        projects = [
            seed.BulkAssignment(role_id, scope_type="Project", project_id=uuid.uuid4())
            for _ in range(assignments)
        ]
        seed.copy_assignments(cur, company_id, {heavy: projects})
    return role_id, heavy


def _change(container: Container, role_id: uuid.UUID) -> None:
    """The role's permissions changed, announced inline: one event per holder, in the same transaction."""
    seed.change_permissions(
        container.stores.identity_transactions, role_id, ["deals.read", "deals.sign"], FanOutPolicy(1_000)
    )


def _publish(container: Container) -> None:
    relay = container.jobs.outbox_relay()
    running = threading.Thread(
        target=relay.run, args=(threading.Event(),), kwargs={"once": True}, daemon=True
    )
    running.start()
    running.join(120)
    assert not running.is_alive(), "the relay never drained the outbox"


def test_a_user_of_10000_assignments_is_published_beside_the_others(
    container: Container, database_url: str, tap: EventTap
) -> None:
    role_id, heavy = _role_with_a_heavy_holder(container, database_url, 10_000)
    _change(container, role_id)
    [(size,)] = _rows(database_url, "SELECT max(octet_length(value)) FROM identity.outbox_events")

    _publish(container)

    told = tap.wait_for(lambda e: e.payload.get("changedRoleId") == str(role_id), ORDINARY + 1, timeout_s=60)
    heavy_event = next(e for e in told if e.key == str(heavy))
    assert len(heavy_event.payload["activeAssignments"]) == 10_000
    assert size > 1_000_000  # over librdkafka's default limit: it took the topic's own
    assert _rows(database_url, "SELECT count(*) FROM identity.outbox_dead_letters") == [(0,)]


def _rows(database_url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture
def small_limit(settings: Settings, own_broker: str) -> Iterator[Settings]:
    """A broker of the test's own whose access topic takes no event over 20,000 bytes."""
    own = settings.model_copy(update={"kafka_bootstrap_servers": own_broker})
    Container(own).connections.ensure_topics()
    admin = AdminClient({"bootstrap.servers": own_broker})
    entry = ConfigEntry("max.message.bytes", "20000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, ACCESS_TOPIC, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()
    yield own


def test_with_a_topic_that_takes_20000_bytes_only_the_larger_event_is_dead_lettered(
    small_limit: Settings, database_url: str
) -> None:
    container = Container(small_limit)
    role_id, heavy = _role_with_a_heavy_holder(container, database_url, 500)
    _change(container, role_id)
    tap = EventTap(str(small_limit.kafka_bootstrap_servers), PUBLISHED_TOPICS)
    try:
        _publish(container)
        told = tap.wait_for(lambda e: e.payload.get("changedRoleId") == str(role_id), ORDINARY, timeout_s=60)
    finally:
        tap.close()
        container.close()

    assert heavy not in {uuid.UUID(e.key) for e in told}
    dead = _rows(database_url, "SELECT message_key, error FROM identity.outbox_dead_letters")
    assert [(key, "MSG_SIZE_TOO_LARGE" in error) for key, error in dead] == [(str(heavy), True)]


def test_a_request_the_broker_refuses_is_tried_event_by_event_and_only_the_culprit_is_rejected(
    small_limit: Settings, database_url: str
) -> None:
    """A producer that does not know the topic's limit (it could not read it, or the limit was lowered since):
    the broker refuses the whole request of a partition; each of its events is tried alone, and only the
    one refused alone is rejected."""
    container = Container(small_limit)
    role_id, heavy = _role_with_a_heavy_holder(container, database_url, 500)
    _change(container, role_id)
    queue = container.jobs.outbox_relay()._queue
    rows = read_rows(queue, 1_000, 0)
    publisher = KafkaEventPublisher(
        container.connections.kafka_client_config,
        None,
        transactional_id=f"test-refused-{uuid.uuid4()}",
        clock=ManualClock(),
    )
    rejected: dict[int, str] = {}
    delivered: set[int] = set()
    try:
        report = publisher.send(rows)
        rejected.update(report.rejected)
        pending = {row.outbox_id for row in rows}

        def settled() -> bool:
            answer = publisher.collect(0.1)
            delivered.update(answer.delivered)
            rejected.update(answer.rejected)
            again = [row for row in rows if row.outbox_id in answer.retry]
            if again:
                rejected.update(publisher.send(again).rejected)
            return pending <= delivered | set(rejected)

        wait_until(settled, "every event is delivered or rejected", timeout_s=60, every_s=0)
    finally:
        publisher.discard()
        container.close()

    by_key = {row.outbox_id: row.key for row in rows}
    assert [by_key[outbox_id] for outbox_id in rejected] == [str(heavy)]
    assert delivered == {row.outbox_id for row in rows} - set(rejected)  # the company's and the 20 users'
    assert len(delivered) == ORDINARY + 1

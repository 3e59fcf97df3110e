"""A topic the relay publishes to goes missing (deleted by mistake, a cluster migration): the relay holds its
events, says so, and publishes every one once the topic exists again, recreated by the relay or by an
operator; nothing is dead-lettered for it. Each test deletes a topic, so each has a broker of its own (the
session broker's topics are every test's). The relay where it may not create topics at all, with /readyz and
`kafka ensure-topics`: tests/acceptance/test_worker_missing_topic.py."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException

from pin_identity.composition import Container
from pin_identity.composition.connections import Connections
from pin_identity.config import Settings
from pin_identity.domain.events import ACCESS_TOPIC, USERS_TOPIC
from pin_identity.simulation.simulated_talent import create_talent_topics, generate_dataset
from tests.support import seed, talent
from tests.support.brokers import delete_topic
from tests.support.kafka_tap import EventTap
from tests.support.relay import (
    RelaySignals,
    change_permissions_inline,
    outbox_count,
    users_told_of_the_change,
)
from tests.support.talent import TalentTopics
from tests.support.waiting import wait_until

HOLDERS = 20
# The events in flight to a deleted topic are given up on after 3 s, and a producer that meets a topic the
# broker does not have says so after 1 s (production: a minute, and librdkafka's 30 s).
SHORT_TIMEOUTS = '{"message.timeout.ms": "3000", "topic.metadata.propagation.max.ms": "1000"}'

RunRelay = Callable[[Container, RelaySignals], None]


class RefusingConnections(Connections):
    """The broker refuses the relay's topic creation, as one whose ACLs grant it no CREATE would."""

    def ensure_topics(self) -> list[str]:
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed"))


@pytest.fixture
def relay_settings(settings: Settings, own_broker: str) -> Settings:
    """The test's own broker, its topics created."""
    Connections(settings.model_copy(update={"kafka_bootstrap_servers": own_broker})).ensure_topics()
    return settings.model_copy(update={"kafka_bootstrap_servers": own_broker, "kafka_config": SHORT_TIMEOUTS})


@pytest.fixture
def run_relay() -> Iterator[RunRelay]:
    """Runs a container's relay in a thread until the test ends."""
    running: list[tuple[threading.Event, threading.Thread, Container]] = []

    def start(container: Container, signals: RelaySignals) -> None:
        stop = threading.Event()
        relay = container.jobs.outbox_relay(observer=signals)
        thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
        thread.start()
        running.append((stop, thread, container))

    yield start
    for stop, thread, container in running:
        stop.set()
        thread.join(30)
        container.close()


def _published_in_full(settings: Settings, database_url: str, role: uuid.UUID) -> None:
    """The outbox emptied, nothing dead-lettered, and every holder told of the role's change."""
    wait_until(lambda: outbox_count(database_url) == 0, "the outbox is published", timeout_s=60)
    assert outbox_count(database_url, "outbox_dead_letters") == 0
    assert len(users_told_of_the_change(str(settings.kafka_bootstrap_servers), role)) == HOLDERS


def test_the_access_topic_deleted_under_a_running_relay_is_recreated_by_it_and_every_event_arrives(
    relay_settings: Settings, database_url: str, run_relay: RunRelay
) -> None:
    container, signals = Container(relay_settings), RelaySignals()
    _, role = seed.held_role(container.stores.identity_transactions, HOLDERS)
    run_relay(container, signals)
    # The grants are published: the relay's producer knows the topic when it goes.
    wait_until(lambda: outbox_count(database_url) == 0, "the grants are published")
    delete_topic(str(relay_settings.kafka_bootstrap_servers), ACCESS_TOPIC)
    change_permissions_inline(container, role, HOLDERS)
    _published_in_full(relay_settings, database_url, role)
    assert signals.recreated == [ACCESS_TOPIC]


def test_a_relay_that_starts_while_the_access_topic_is_missing_recreates_it_and_every_event_arrives(
    relay_settings: Settings, database_url: str, run_relay: RunRelay
) -> None:
    """Its producer has never seen the topic (a relay restarted after the deletion, a standby taking over):
    the broker's first answer is "unknown topic", and the recreated topic must be known to it at once."""
    container, signals = Container(relay_settings), RelaySignals()
    _, role = seed.held_role(container.stores.identity_transactions, HOLDERS)
    delete_topic(str(relay_settings.kafka_bootstrap_servers), ACCESS_TOPIC)
    change_permissions_inline(container, role, HOLDERS)
    run_relay(container, signals)
    _published_in_full(relay_settings, database_url, role)
    assert signals.recreated == [ACCESS_TOPIC]


def test_a_relay_refused_the_topics_creation_holds_says_so_and_goes_on_once_an_operator_creates_it(
    relay_settings: Settings, database_url: str, run_relay: RunRelay
) -> None:
    container, signals = Container(relay_settings), RelaySignals()
    container.connections = RefusingConnections(relay_settings)
    _, role = seed.held_role(container.stores.identity_transactions, HOLDERS)
    run_relay(container, signals)
    wait_until(lambda: outbox_count(database_url) == 0, "the grants are published")
    delete_topic(str(relay_settings.kafka_bootstrap_servers), ACCESS_TOPIC)
    change_permissions_inline(container, role, HOLDERS)
    assert signals.topic_held.wait(30), "the relay says it holds the topic's events"
    assert "TOPIC_AUTHORIZATION_FAILED" in signals.held[ACCESS_TOPIC]
    assert outbox_count(database_url) == HOLDERS
    assert outbox_count(database_url, "outbox_dead_letters") == 0
    Connections(relay_settings).ensure_topics()  # the operator, as `pin-identity kafka ensure-topics` does
    _published_in_full(relay_settings, database_url, role)
    assert signals.recreated == []


MANAGERS = 3_000


def test_a_missing_users_topic_holds_only_its_own_events_while_the_access_events_flow(
    relay_settings: Settings, database_url: str, run_relay: RunRelay
) -> None:
    """pin.identity.users.v1 deleted under a relay that may not create topics. Talent-sync applies a company
    of 3,000 managers (a UserUpserted and a UserAccessChanged each, with one key), and a role of local users
    changes: every access event arrives within seconds, the upserts wait in the outbox, and they go out once
    the topic is back (`kafka ensure-topics`)."""
    settings = relay_settings.model_copy(update={"outbox_relay_creates_topics": False})
    container, signals = Container(settings), RelaySignals()
    bootstrap = str(settings.kafka_bootstrap_servers)
    topics = TalentTopics.fresh()
    create_talent_topics(
        container.connections.kafka_client_config, 3, tenants_topic=topics.tenants, users_topic=topics.users
    )
    _, role = seed.held_role(container.stores.identity_transactions, HOLDERS)
    run_relay(container, signals)
    wait_until(lambda: outbox_count(database_url) == 0, "the grants are published")
    delete_topic(bootstrap, USERS_TOPIC)
    tap = EventTap(bootstrap, [ACCESS_TOPIC])
    try:
        dataset = generate_dataset(1, MANAGERS, seed=44)
        talent.produce(container, topics, dataset)
        talent.run_until_caught_up(talent.sync_job(container, topics))
        change_permissions_inline(container, role, HOLDERS)
        began = time.monotonic()
        access = tap.wait_for(lambda e: e.topic == ACCESS_TOPIC, MANAGERS + HOLDERS, timeout_s=60)
        access_s = time.monotonic() - began
        waiting = outbox_count(database_url)

        Connections(settings).ensure_topics()  # the operator, as `pin-identity kafka ensure-topics` does
    finally:
        tap.close()
    recreated = EventTap(bootstrap, [USERS_TOPIC], from_beginning=True)
    try:
        upserts = recreated.wait_for(lambda e: e.topic == USERS_TOPIC, MANAGERS, timeout_s=60)
    finally:
        recreated.close()

    print(
        f"{MANAGERS + HOLDERS} access events arrived {access_s:.1f} s after the change (users topic missing)"
    )
    assert access_s < 30
    assert waiting == MANAGERS  # the upserts, and only they, waited in the outbox
    assert {e.payload["changeReason"] for e in access} == {"RoleAssigned", "RolePermissionsChanged"}
    assert len({e.key for e in upserts}) == MANAGERS
    wait_until(lambda: outbox_count(database_url) == 0, "the outbox is drained")
    assert outbox_count(database_url, "outbox_dead_letters") == 0

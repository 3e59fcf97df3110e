"""The relay's publisher against a real broker: in a transaction, an event counts as acknowledged only once
its transaction committed, whatever the broker reported for it before."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pin_identity.adapters.kafka.publisher import KafkaEventPublisher
from pin_identity.operations.ports.outbox import PendingEvent, PublishReport
from tests.support.clocks import ManualClock
from tests.support.waiting import holds_within, wait_until


@pytest.fixture
def topic(broker: str) -> str:
    """A topic of the test's own, one partition."""
    name = f"test.publisher.{uuid.uuid4()}"
    admin = AdminClient({"bootstrap.servers": broker})
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result()
    return name


@pytest.fixture
def publisher(broker: str) -> Iterator[KafkaEventPublisher]:
    """Transactional, as the relay's; its clock stands still, so a transaction commits only when the test
    waits for answers (collect with a timeout), never by age."""
    built = KafkaEventPublisher(
        # An unknown topic is said within 0.1 s instead of librdkafka's 30 s.
        {"bootstrap.servers": broker, "topic.metadata.propagation.max.ms": "100"},
        ensure_topics=lambda: [],
        transactional_id=f"test-publisher-{uuid.uuid4()}",
        clock=ManualClock(),
    )
    yield built
    built.discard()


def _event(outbox_id: int, topic: str, key: str) -> PendingEvent:
    return PendingEvent(outbox_id, topic, key, b"{}", "UserAccessChanged", str(uuid.uuid4()), None)


def _written(broker: str, topic: str) -> int:
    """Records in the partition's log, those of open transactions included (the high watermark)."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker,
            "group.id": "test-publisher-watermarks",
            "isolation.level": "read_uncommitted",  # else the end is the last stable offset
        }
    )
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def _answers_until(publisher: KafkaEventPublisher, answered: set[int], *, wait_s: float) -> PublishReport:
    """Every answer the publisher gives until each of `answered` has one (delivered, rejected or retry)."""
    seen = PublishReport()

    def all_answered() -> bool:
        report = publisher.collect(wait_s)
        seen.delivered.extend(report.delivered)
        seen.rejected.update(report.rejected)
        seen.retry.update(report.retry)
        return answered <= {*seen.delivered, *seen.rejected, *seen.retry}

    assert holds_within(all_answered, 30, every_s=0), f"no answer for {answered} in 30 s: {seen}"
    return seen


def test_an_aborted_transaction_acknowledges_nothing_not_even_a_keys_second_event(
    publisher: KafkaEventPublisher, broker: str, topic: str
) -> None:
    """Two events of one key in flight at once (the second gets a delivery callback of its own), both written
    by the broker; then an event for a topic the broker does not have, so the transaction is aborted: none of
    them was ever acknowledged, and all go again."""
    key = str(uuid.uuid4())
    sent_at_once = publisher.send([_event(1, topic, key), _event(2, topic, key)])
    assert sent_at_once == PublishReport()
    early: list[int] = []

    def written() -> bool:
        early.extend(publisher.collect(0).delivered)  # serves their delivery reports
        return _written(broker, topic) == 2

    wait_until(written, "the broker wrote both events")
    nowhere = _event(3, f"test.publisher.missing.{uuid.uuid4()}", str(uuid.uuid4()))
    assert publisher.send([nowhere]) == PublishReport()
    answers = _answers_until(publisher, {3}, wait_s=0)
    assert [*early, *answers.delivered] == []
    assert sorted(answers.retry) == [1, 2, 3]


def test_a_committed_transaction_acknowledges_every_event_of_it_a_keys_second_too(
    publisher: KafkaEventPublisher, topic: str
) -> None:
    first, other = str(uuid.uuid4()), str(uuid.uuid4())
    publisher.send([_event(1, topic, first), _event(2, topic, first), _event(3, topic, other)])
    answers = _answers_until(publisher, {1, 2, 3}, wait_s=0.05)  # a wait commits the transaction
    assert sorted(answers.delivered) == [1, 2, 3]
    assert answers.rejected == {} and answers.retry == {}

"""The audit knows it has read the access topic whole from the end offsets taken when it began, never from a
quiet period: records written after that are the next audit's business, and a partition it could not read to
that end (stalled, unreachable) is reported as incomplete rather than counted as read."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pin_identity.adapters.kafka.access_log import KafkaAccessLog
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.domain.access_verdicts import LastEvent
from pin_identity.domain.events import ACCESS_TOPIC
from tests.support.brokers import ProxiedBroker, proxied_broker

PARTITIONS = 6


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[ProxiedBroker]:
    with proxied_broker(tmp_path / "broker") as broker:
        ensure_topics({"bootstrap.servers": broker.bootstrap}, [ACCESS_TOPIC], TopicLayout(PARTITIONS, 1))
        yield broker


def _produce(bootstrap: str, count: int, pad: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n in range(count):
        value = b'{"payload": {"activeAssignments": []}, "n": %d, "pad": "%s"}' % (n, b"x" * pad)
        while True:
            try:
                producer.produce(ACCESS_TOPIC, key=str(uuid.uuid4()), value=value)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def test_records_written_after_the_audit_began_are_left_to_the_next(proxied: ProxiedBroker) -> None:
    _produce(proxied.bootstrap, 3000)
    kept: list[LastEvent] = []
    wrote_more = threading.Event()

    def keep(records: Sequence[LastEvent]) -> None:
        kept.extend(records)
        if not wrote_more.is_set():  # the ends are taken: what comes now is not this audit's
            wrote_more.set()
            _produce(proxied.bootstrap, 500)

    read = KafkaAccessLog({"bootstrap.servers": proxied.bootstrap}).read(keep, lambda done, total: None)
    assert (read.records, read.incomplete) == (3000, [])
    assert len(kept) == 3000


def test_a_partition_that_stalls_is_reported_incomplete_not_read(proxied: ProxiedBroker) -> None:
    # 30 MB: far more than the reader fetches ahead (about 1 MB a partition), so the stall is felt.
    _produce(proxied.bootstrap, 30_000, pad=1000)
    batches = 0

    def keep(records: Sequence[LastEvent]) -> None:
        nonlocal batches
        batches += 1
        if batches == 1:  # the first records are in: the broker goes silent for the rest
            proxied.proxy.stall()

    log = KafkaAccessLog({"bootstrap.servers": proxied.bootstrap}, stall_s=2.0)
    read = log.read(keep, lambda done, total: None)
    proxied.proxy.restore()
    assert read.incomplete, "a stalled read must not pass for a whole one"
    assert read.records < 30_000
    assert set(read.incomplete) <= set(range(PARTITIONS))

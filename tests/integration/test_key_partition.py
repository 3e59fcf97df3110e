"""The partition computed for a key is the one librdkafka's producer delivered it to: keys produced to a real
broker with each supported partitioner (the relay's default first), on topics of a few partition counts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pin_identity.adapters.kafka.partitioning import (
    DEFAULT_PARTITIONER,
    SUPPORTED_PARTITIONERS,
    UnsupportedPartitionerError,
    key_partition,
    partitioner_of,
)
from pin_identity.adapters.kafka.publisher import producer_config

KEYS = 300
PARTITION_COUNTS = (1, 3, 7, 12)


@pytest.fixture(scope="module")
def topics(broker: str) -> Iterator[dict[int, str]]:
    """A topic of each partition count, of this module's own."""
    suffix = uuid.uuid4().hex[:8]
    named = {count: f"partitioning.{count}.{suffix}" for count in PARTITION_COUNTS}
    admin = AdminClient({"bootstrap.servers": broker})
    created = admin.create_topics([NewTopic(name, count, 1) for count, name in named.items()])
    for future in created.values():
        future.result(timeout=30)
    yield named
    admin.delete_topics(list(named.values()))


def _delivered(broker: str, topic: str, keys: list[bytes], partitioner: str | None) -> dict[bytes, int]:
    """Each key produced once, with the relay's producer settings; the partition the broker acknowledged."""
    overrides = {} if partitioner is None else {"partitioner": partitioner}
    producer = Producer(producer_config({"bootstrap.servers": broker, **overrides}))
    delivered: dict[bytes, int] = {}

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        assert error is None, error
        delivered[message.key()] = message.partition()  # type: ignore[index]

    for key in keys:
        producer.produce(topic, value=b"{}", key=key, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return delivered


@pytest.mark.parametrize("partitions", PARTITION_COUNTS)
def test_the_default_partitioner_puts_each_key_where_it_is_computed(
    broker: str, topics: dict[int, str], partitions: int
) -> None:
    keys = [str(uuid.uuid4()).encode() for _ in range(KEYS)]
    delivered = _delivered(broker, topics[partitions], keys, partitioner=None)  # librdkafka's own default
    computed = {key: key_partition(key, partitions) for key in keys}
    assert computed == delivered
    assert partitioner_of({}) == DEFAULT_PARTITIONER
    if partitions > 1:  # the keys spread: a constant answer would not pass by luck
        assert len(set(delivered.values())) == partitions


@pytest.mark.parametrize("partitioner", SUPPORTED_PARTITIONERS)
def test_every_supported_partitioner_set_in_the_config_is_honoured(
    broker: str, topics: dict[int, str], partitioner: str
) -> None:
    # Keys of every length modulo 4, for murmur2's tail, besides the uuids we send.
    keys = [str(uuid.uuid4()).encode()[: 33 + n % 4] for n in range(KEYS)]
    delivered = _delivered(broker, topics[12], keys, partitioner)
    chosen = partitioner_of({"partitioner": partitioner})
    assert {key: key_partition(key, 12, chosen) for key in keys} == delivered


def test_a_partitioner_that_places_keys_at_random_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedPartitionerError, match=r"'random'.*supported: consistent_random"):
        partitioner_of({"partitioner": "random"})

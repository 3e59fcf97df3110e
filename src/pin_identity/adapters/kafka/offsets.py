"""A partition's offsets, asked of its leader.

A leader can be moving (a topic just created, a broker restarting, an election): the broker then answers
NOT_LEADER_FOR_PARTITION or LEADER_NOT_AVAILABLE, which librdkafka reports as retriable without retrying a
watermark query itself. Every reader that needs a partition's end asks here, and asks again until the answer
comes or its time is up.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

_RETRY_EVERY_S = 0.1


def watermarks(consumer: Consumer, partition: TopicPartition, timeout_s: float = 10.0) -> tuple[int, int]:
    """(low, high): the partition's first offset and its end (for a read_committed consumer, the last stable
    offset: nothing an open transaction wrote lies below it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                partition, timeout=max(deadline - time.monotonic(), 0.1), cached=False
            )
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, KafkaError) and (error.retriable() or error.code() in _MOVING)
            if not retriable or time.monotonic() + _RETRY_EVERY_S > deadline:
                raise
        time.sleep(_RETRY_EVERY_S)


# Retriable by Kafka's protocol, whatever librdkafka's flag says of them in a given version.
_MOVING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.REPLICA_NOT_AVAILABLE,
}

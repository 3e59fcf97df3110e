"""A partition's offsets, asked of its leader, and how far a consumer's messages show it read.

A leader can be moving (a topic just created, a broker restarting, an election): the broker then answers
NOT_LEADER_FOR_PARTITION or LEADER_NOT_AVAILABLE, which librdkafka reports as retriable without retrying a
watermark query itself. Every reader that needs a partition's end asks here, and asks again until the answer
comes or its time is up.

A reader that reads up to an end taken before it began knows it is there from `end_reached`: an end of
partition signal says where the fetch that sent it saw the end, and a fetch from a follower, or from a leader
just elected, can see it below the end taken before. Such a signal is a step of the read, not its end.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from pin_identity.adapters.system_clock import SYSTEM_CLOCK

_RETRY_EVERY_S = 0.1


def watermarks(consumer: Consumer, partition: TopicPartition, timeout_s: float = 10.0) -> tuple[int, int]:
    """(low, high): the partition's first offset and its end (for a read_committed consumer, the last stable
    offset: nothing an open transaction wrote lies below it)."""
    deadline = SYSTEM_CLOCK.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                partition, timeout=max(deadline - SYSTEM_CLOCK.monotonic(), 0.1), cached=False
            )
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = isinstance(error, KafkaError) and (error.retriable() or error.code() in _MOVING)
            if not retriable or SYSTEM_CLOCK.monotonic() + _RETRY_EVERY_S > deadline:
                raise
        time.sleep(_RETRY_EVERY_S)


# Retriable by Kafka's protocol, whatever librdkafka's flag says of them in a given version.
_MOVING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.REPLICA_NOT_AVAILABLE,
}


def read_up_to(message: Message) -> int | None:
    """The offset up to which `message` shows its partition read: after a record, or where an end of
    partition signal saw the end (records just below it may be gone: compacted, or transaction markers).
    None for any other error."""
    error = message.error()
    if error is None:
        return (message.offset() or 0) + 1
    if error.code() == KafkaError._PARTITION_EOF:
        return message.offset() or 0
    return None


def end_reached(message: Message, end: int) -> bool:
    """Whether `message` shows its partition read up to `end`, an end offset taken before the read: a record
    at or past its last offset, or an end of partition signal at or past it."""
    up_to = read_up_to(message)
    return up_to is not None and up_to >= end

"""The access topic read whole, for the audit: every partition from its beginning, each user's last event."""

from __future__ import annotations

import json
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from pin_identity.domain.access_audit import UNREADABLE, Fingerprint, UserKey, fingerprint
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.observability.logging import get_logger
from pin_identity.operations.access_audit import Progress

log = get_logger("access-audit")


class KafkaAccessLog:
    """Reads up to the end offsets seen when it starts, then on until the topic has been quiet for
    `quiet_s` (a broker may report an end lower than the truth). Keeps 16 + 8 bytes per user, not events."""

    def __init__(
        self,
        client_config: dict[str, str],
        *,
        topic: str = ACCESS_TOPIC,
        quiet_s: float = 1.0,
        stall_s: float = 15.0,
    ):
        self._config = {
            **client_config,
            "group.id": "pin-identity-access-audit",  # never joined: partitions are assigned
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        self._topic, self._quiet_s, self._stall_s = topic, quiet_s, stall_s

    def last_fingerprints(self, progress: Progress) -> dict[UserKey, Fingerprint]:
        consumer = Consumer(self._config)
        try:
            ends, total = self._assign(consumer)
            return self._read(consumer, ends, total, progress) if ends else {}
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer) -> tuple[dict[int, int], int]:
        metadata = consumer.list_topics(self._topic, timeout=10)
        topic = metadata.topics.get(self._topic)
        if topic is None or topic.error is not None:
            return {}, 0
        ends, total = {}, 0
        for partition in topic.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(self._topic, partition), timeout=10)
            ends[partition], total = high, total + max(high - low, 0)
        consumer.assign([TopicPartition(self._topic, p, OFFSET_BEGINNING) for p in ends])
        return ends, total

    def _read(
        self, consumer: Consumer, ends: dict[int, int], total: int, progress: Progress
    ) -> dict[UserKey, Fingerprint]:
        last: dict[UserKey, Fingerprint] = {}
        behind = {p for p, end in ends.items() if end > 0}
        read, heard = 0, time.monotonic()
        while True:
            messages = consumer.consume(5000, 0.2)
            now = time.monotonic()
            for message in messages:
                if message.error() is not None:
                    continue
                heard = now
                read += 1
                _remember(last, message)
                if (message.offset() or 0) + 1 >= ends.get(message.partition() or 0, 0):
                    behind.discard(message.partition() or 0)
            progress(read, max(total, read))
            quiet_for = now - heard
            if (not behind and quiet_for >= self._quiet_s) or quiet_for >= self._stall_s:
                break
        if behind:
            log.warning("access-audit-read-short", partitions=sorted(behind), records=read)
        return last


def _remember(last: dict[UserKey, Fingerprint], message: Message) -> None:
    key = message.key()
    try:
        user = uuid.UUID(key.decode() if isinstance(key, bytes) else str(key)).bytes
    except ValueError:
        return  # not a user's event
    value = message.value()
    if value is None:
        last.pop(user, None)  # a tombstone: compaction will forget the user's events
        return
    try:
        body = json.loads(value)
        last[user] = fingerprint(body["payload"]["activeAssignments"])
    except (ValueError, KeyError, TypeError):
        last[user] = UNREADABLE

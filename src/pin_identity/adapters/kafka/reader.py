"""Reading our own events back (the demo's checks): no consumer group, partitions assigned at their end."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition


@dataclass(frozen=True)
class ReadEvent:
    topic: str
    partition: int
    offset: int
    key: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.body["payload"]
        return payload


class TopicReader:
    """Starts at each partition's high watermark, so it sees what is published after it was opened.

    A broker may report a watermark lower than the truth (never higher), so a reader can also see a few
    older records: callers filter by the ids they expect.
    """

    def __init__(self, client_config: dict[str, str], topics: Iterable[str]):
        self._consumer = Consumer(
            {
                **client_config,
                "group.id": "pin-identity-reader",  # never joined: partitions are assigned, not subscribed
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        metadata = self._consumer.list_topics(timeout=10)
        assignment = []
        for topic in topics:
            for partition in metadata.topics[topic].partitions:
                _, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                assignment.append(TopicPartition(topic, partition, high))
        self._consumer.assign(assignment)

    def read(self, timeout_s: float = 0.2, max_records: int = 10_000) -> list[ReadEvent]:
        events = []
        for message in self._consumer.consume(max_records, timeout_s):
            if message.error():
                continue
            key, value = message.key(), message.value()
            events.append(
                ReadEvent(
                    topic=message.topic() or "",
                    partition=message.partition() or 0,
                    offset=message.offset() or 0,
                    key=key.decode() if isinstance(key, bytes) else str(key),
                    headers=_headers(message.headers()),
                    body=json.loads(value) if value else {},
                )
            )
        return events

    def close(self) -> None:
        self._consumer.close()


def _headers(raw: object) -> dict[str, str]:
    """Consumed headers arrive as a list of (name, bytes) pairs."""
    pairs = raw if isinstance(raw, list) else []
    return {str(name): value.decode() for name, value in pairs if isinstance(value, bytes)}

"""Reads back what the relay published, from where the topics stood when the tap was opened."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition


@dataclass(frozen=True)
class ConsumedEvent:
    topic: str
    partition: int
    offset: int
    key: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def payload(self) -> dict[str, Any]:
        return self.body["payload"]  # type: ignore[no-any-return]


class EventTap:
    """No consumer group (no join delay): partitions are assigned at their high watermarks.

    The embedded broker may report a watermark that is too low, never too high, so a tap can see a few
    older records; tests filter what they read by the ids they created.
    """

    def __init__(self, bootstrap_servers: str, topics: Iterable[str]):
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"tap-{uuid.uuid4()}",
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
        self.received: list[ConsumedEvent] = []

    def poll(self, timeout_s: float = 0.2) -> None:
        for message in self._consumer.consume(10_000, timeout_s):
            if message.error():
                continue
            self.received.append(
                ConsumedEvent(
                    topic=message.topic(),
                    partition=message.partition(),
                    offset=message.offset(),
                    key=message.key().decode(),
                    headers={k: v.decode() for k, v in (message.headers() or [])},
                    body=json.loads(message.value()),
                )
            )

    def wait_for(
        self, where: Callable[[ConsumedEvent], bool], count: int, timeout_s: float = 30.0
    ) -> list[ConsumedEvent]:
        """Poll until `count` matching events arrived (fails the test on timeout); returns them."""
        deadline = time.monotonic() + timeout_s
        while True:
            matching = [event for event in self.received if where(event)]
            if len(matching) >= count or time.monotonic() > deadline:
                assert len(matching) >= count, f"received {len(matching)} of {count} events in {timeout_s}s"
                return matching
            self.poll()

    def settle(self, where: Callable[[ConsumedEvent], bool], quiet_s: float = 1.0) -> list[ConsumedEvent]:
        """Everything matching that arrives until the topic has been quiet for `quiet_s`."""
        deadline = time.monotonic() + quiet_s
        seen = len(self.received)
        while time.monotonic() < deadline:
            self.poll(0.1)
            if len(self.received) != seen:
                seen, deadline = len(self.received), time.monotonic() + quiet_s
        return [event for event in self.received if where(event)]

    def close(self) -> None:
        self._consumer.close()

"""Reading our own events back (the demo's checks, the tests): no consumer group, partitions assigned at the
end offsets they have when the reader is opened."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition

from pin_identity.adapters.kafka.consumers import new_consumer
from pin_identity.adapters.kafka.offsets import read_up_to, watermarks
from pin_identity.adapters.system_clock import SYSTEM_CLOCK


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
    """Sees what is published after it was opened (or, `from_beginning`, everything the topics hold).
    `read_to_end` reads up to the end offsets the topics have when it is called (what every acknowledged
    event lies below), so a caller whose events are all acknowledged knows it has them all without waiting
    for a quiet period. Only committed transactions are read (`read_committed`, pinned in consumers.py)."""

    def __init__(self, client_config: dict[str, str], topics: Iterable[str], *, from_beginning: bool = False):
        self._consumer = new_consumer(
            client_config,
            {
                "group.id": "pin-identity-reader",  # never joined: partitions are assigned, not subscribed
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
            },
        )
        metadata = self._consumer.list_topics(timeout=10)
        self._assigned = []
        for topic in topics:
            for partition in metadata.topics[topic].partitions:
                low, high = watermarks(self._consumer, TopicPartition(topic, partition))
                self._assigned.append(TopicPartition(topic, partition, low if from_beginning else high))
        self._consumer.assign(self._assigned)
        # How far each partition is read (offsets.py: an end reported by a lagging replica may lie below
        # the end offsets `read_to_end` waits for, and is only a step towards them).
        self._read_to = {(tp.topic, tp.partition): tp.offset for tp in self._assigned}

    def read(self, timeout_s: float = 0.2, max_records: int = 10_000) -> list[ReadEvent]:
        events = []
        for message in self._consumer.consume(max_records, timeout_s):
            where = (message.topic() or "", message.partition() or 0)
            up_to = read_up_to(message)
            if up_to is not None:
                self._read_to[where] = max(self._read_to[where], up_to)
            if message.error() is None:
                events.append(_event(message))
        return events

    def read_to_end(self, timeout_s: float = 30.0) -> list[ReadEvent]:
        """Everything up to the end offsets the topics have now; TimeoutError if that takes `timeout_s`."""
        ends = {(tp.topic, tp.partition): watermarks(self._consumer, tp)[1] for tp in self._assigned}
        events: list[ReadEvent] = []
        deadline = SYSTEM_CLOCK.monotonic() + timeout_s
        while behind := {where: end for where, end in ends.items() if self._read_to[where] < end}:
            if SYSTEM_CLOCK.monotonic() > deadline:
                short = ", ".join(f"{t}[{p}] at {self._read_to[t, p]} of {n}" for (t, p), n in behind.items())
                raise TimeoutError(f"not read to the end offsets in {timeout_s:g} s: {short}")
            events.extend(self.read())
        return events

    def close(self) -> None:
        self._consumer.close()


def _event(message: Any) -> ReadEvent:
    key, value = message.key(), message.value()
    return ReadEvent(
        topic=message.topic() or "",
        partition=message.partition() or 0,
        offset=message.offset() or 0,
        key=key.decode() if isinstance(key, bytes) else str(key),
        headers=_headers(message.headers()),
        body=json.loads(value) if value else {},
    )


def _headers(raw: object) -> dict[str, str]:
    """Consumed headers arrive as a list of (name, bytes) pairs."""
    pairs = raw if isinstance(raw, list) else []
    return {str(name): value.decode() for name, value in pairs if isinstance(value, bytes)}

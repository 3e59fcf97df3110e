"""A broker of a test's own that the test stops, kills and starts again on the same port and log directory."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pin_identity.adapters.kafka.embedded import free_port, kill_broker, start_broker, stop_broker
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics


@dataclass
class RestartableBroker:
    home: Path
    port: int
    pid: int = 0

    @classmethod
    def started(cls, home: Path, topics: Iterable[str] = (), partitions: int = 3) -> RestartableBroker:
        broker = cls(home, free_port())
        broker.start()
        if topics:
            ensure_topics({"bootstrap.servers": broker.bootstrap}, topics, TopicLayout(partitions, 1))
        return broker

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.pid = start_broker(self.home, self.port).pid

    def stop(self) -> None:
        """A clean stop (SIGTERM)."""
        stop_broker(self.pid)

    def kill(self) -> None:
        """A crash (SIGKILL): no shutdown of any kind; what the broker acknowledged is in its log files."""
        kill_broker(self.pid)


# Compaction within seconds (segment.bytes may not go below 1 MiB, so segments roll by time): a segment rolls
# on the first append 100 ms after it began, the cleaner (which looks every 0.5 s on the embedded broker)
# takes any log with a dirty record, and a record is cleanable at once.
FAST_SEGMENT_S = 0.1
FAST_COMPACTION = {
    "cleanup.policy": "compact",
    "segment.ms": str(int(FAST_SEGMENT_S * 1000)),
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}


def create_compacting_topics(
    bootstrap: str, names: Iterable[str], partitions: int, *, tombstones_kept_ms: int = 100
) -> None:
    """Topics compacted within seconds; their tombstones stay `tombstones_kept_ms` after a cleaning."""
    config = {**FAST_COMPACTION, "delete.retention.ms": str(tombstones_kept_ms)}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config) for name in names])
    for future in futures.values():
        future.result()


def roll_segments(bootstrap: str, topics: Iterable[str], partitions: int) -> None:
    """Close the active segment of every partition (the cleaner never touches an active one): once
    `segment.ms` has passed, the next append rolls it, here a tombstone of a key no one uses. The wait is for
    the broker's clock; nothing else can say a segment is old enough. The key is a uuid no one has: every
    reader skips the deletion of an entity it never knew."""
    time.sleep(FAST_SEGMENT_S * 1.5)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for topic in topics:
        for partition in range(partitions):
            producer.produce(topic, key=str(uuid.uuid4()), value=None, partition=partition)
    assert producer.flush(30) == 0

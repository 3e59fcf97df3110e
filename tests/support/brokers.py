"""A broker of a test's own that the test stops, kills and starts again on the same port and log directory, or
reaches only through a proxy it stalls."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pin_identity.adapters.kafka.embedded_kafka import free_port, kill_broker, start_broker, stop_broker
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until


@dataclass
class ProxiedBroker:
    """A broker behind a TCP proxy: clients keep one address across the broker's restarts, and the broker its
    log directory."""

    proxy: TcpProxy
    home: Path
    port: int  # the broker's own; it advertises the proxy's, so that every connection goes through the proxy
    pid: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.listen_port}"

    def stop(self) -> None:
        stop_broker(self.pid)

    def restart(self) -> None:
        self.pid = start_broker(self.home, self.port, advertised_port=self.proxy.listen_port).pid


@contextmanager
def proxied_broker(home: Path) -> Iterator[ProxiedBroker]:
    """A broker of the block's own behind a proxy that the test stalls and restores."""
    proxy_port, broker_port = free_port(), free_port()
    pid = start_broker(home, broker_port, advertised_port=proxy_port).pid
    broker = ProxiedBroker(TcpProxy(proxy_port, broker_port), home, broker_port, pid)
    try:
        yield broker
    finally:
        broker.proxy.close()
        broker.stop()


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
        start_transaction_coordinator(broker.bootstrap)
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


_FIRST_INIT = (
    "import sys; from confluent_kafka import Producer; "
    "Producer({'bootstrap.servers': sys.argv[1], 'transactional.id': 'test-warm-up'}).init_transactions(30)"
)


def start_transaction_coordinator(bootstrap: str) -> None:
    """Bring up a new broker's transaction coordinator, as a cluster in service has it, before a relay meets
    it. librdkafka 2.16 sometimes aborts the process ("rd_kafka_txn_set_state: Assertion ... Invalid
    transaction state transition") when a producer's first init_transactions() meets a coordinator still
    loading its log; seen twice in about a dozen fresh brokers here (README, "Known issues"). The throwaway
    producer runs in a process of its own, tried again if it is the one that aborts."""
    for _ in range(3):
        command = [sys.executable, "-c", _FIRST_INIT, bootstrap]
        done = subprocess.run(command, check=False, capture_output=True, timeout=90)
        if done.returncode == 0:
            return
    raise RuntimeError(f"no transaction coordinator on {bootstrap}: {done.stderr.decode()[-500:]}")


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


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete a topic (only on a broker of the test's own) and return once the broker no longer lists it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result()
    wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, f"{topic} is gone")

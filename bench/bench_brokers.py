"""The broker a benchmark runs on: the project's embedded Apache Kafka by default. `BENCH_BROKER=cluster`
starts the test suite's three-node cluster (tests/support/cluster.py: replication factor 3,
`min.insync.replicas` 2, as production runs), and the benchmark's topics get three replicas.
`BENCH_KAFKA_BOOTSTRAP=host:port` uses a broker started by hand instead of starting one.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pin_identity.adapters.kafka.distribution import KAFKA_VERSION
from pin_identity.adapters.kafka.embedded_kafka import start_broker, stop_broker
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.domain.events import PUBLISHED_TOPICS

PUBLISHED_PARTITIONS = 12  # of each topic the relay publishes to, as production lays them out


@dataclass(frozen=True)
class BenchBroker:
    name: str
    bootstrap: str
    replication_factor: int = 1  # of the topics the benchmark creates


def broker_name() -> str:
    """What `bench_broker` runs on, as BENCHMARKS.md names it."""
    given = os.environ.get("BENCH_KAFKA_BOOTSTRAP")
    if given:
        return f"a broker at {given}"
    if _asked() == "cluster":
        return f"Apache Kafka {KAFKA_VERSION}, three nodes (replication factor 3, min.insync.replicas 2)"
    return f"Apache Kafka {KAFKA_VERSION}"


def ensure_published_topics(broker: BenchBroker) -> None:
    """The topics the relay publishes to, on the benchmark's broker."""
    layout = TopicLayout(PUBLISHED_PARTITIONS, broker.replication_factor)
    ensure_topics({"bootstrap.servers": broker.bootstrap}, PUBLISHED_TOPICS, layout)


def _asked() -> str:
    return os.environ.get("BENCH_BROKER", "kafka")


@contextmanager
def bench_broker(workdir: Path) -> Iterator[BenchBroker]:
    """A broker of its own (a fresh log directory), stopped at the end."""
    given = os.environ.get("BENCH_KAFKA_BOOTSTRAP")
    if given:
        yield BenchBroker(broker_name(), given)
    elif _asked() == "cluster":
        with _cluster(workdir) as bootstrap:
            yield BenchBroker(broker_name(), bootstrap, replication_factor=3)
    else:
        process = start_broker(workdir / f"kafka-{time.monotonic_ns()}")
        try:
            yield BenchBroker(broker_name(), process.bootstrap_servers)
        finally:
            stop_broker(process.pid)


@contextmanager
def _cluster(workdir: Path) -> Iterator[str]:
    """The suite's own three-node cluster: the benchmarks measure the cluster the tests prove."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.cluster import kafka_cluster

    with kafka_cluster(workdir / f"cluster-{time.monotonic_ns()}") as cluster:
        yield cluster.bootstrap

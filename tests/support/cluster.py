"""A three-node Apache Kafka cluster of a test's own: combined broker+controller nodes, a quorum of three
voters, on loopback ports with a home (log directory) each, replicated as a production cluster is (three
replicas, two in sync to acknowledge). The test stops (SIGTERM), kills (SIGKILL) and starts one node at a time
and waits until every partition has all its replicas in sync again. On a busy 2-core machine the three
nodes serve within about 10-12 s, and a node started again is back in every ISR within 5-9 s."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from pin_identity.adapters.kafka.embedded_kafka import (
    QuorumNode,
    kill_broker,
    launch_node,
    stop_broker,
    wait_node_ready,
)
from tests.support.waiting import wait_until

NODES = 3
# Three JVMs on two cores: a smaller heap each than the single broker's, ample for a test's topics.
NODE_HEAP_MB = 384
# What a production cluster has: every topic, the internal ones too, on three replicas, two of them in sync
# for a write to be acknowledged (acks=all). Lost in-sync replicas show within seconds, not 30.
REPLICATED = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "replica.lag.time.max.ms": "5000",
}
# A restarted node catches up its replicas and rejoins every ISR within this on a busy 2-core machine.
IN_SYNC_TIMEOUT_S = 90.0


@dataclass
class ClusterNode:
    home: Path
    quorum: QuorumNode
    process: subprocess.Popen[bytes] | None = None

    @property
    def node_id(self) -> int:
        return self.quorum.node_id

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class KafkaCluster:
    nodes: list[ClusterNode] = field(default_factory=list)

    @classmethod
    def on_free_ports(cls, root: Path) -> KafkaCluster:
        quorum = [QuorumNode.on_free_ports(node_id) for node_id in range(1, NODES + 1)]
        return cls([ClusterNode(root / f"node-{node.node_id}", node) for node in quorum])

    @property
    def bootstrap(self) -> str:
        """Every node's client address: a client finds the cluster whichever nodes are down."""
        return ",".join(f"127.0.0.1:{node.quorum.port}" for node in self.nodes)

    def node(self, node_id: int) -> ClusterNode:
        return next(node for node in self.nodes if node.node_id == node_id)

    def start_all(self) -> None:
        """Launch every node, then wait for each: none serves clients before a majority of voters runs."""
        for node in self.nodes:
            self._launch(node)
        for node in self.nodes:
            self._wait_ready(node)

    def start(self, node_id: int) -> None:
        node = self.node(node_id)
        self._launch(node)
        self._wait_ready(node)

    def stop(self, node_id: int) -> None:
        """A clean stop (SIGTERM): Kafka's controlled shutdown moves the node's leaders away first."""
        stop_broker(self._pid(node_id))

    def kill(self, node_id: int) -> None:
        """A crash (SIGKILL): no shutdown of any kind."""
        kill_broker(self._pid(node_id))

    def kill_all(self) -> None:
        """The end of a test: nothing of the cluster is kept, so no node waits for a controlled shutdown
        that a lost quorum would hold up."""
        for node in self.nodes:
            if node.running:
                self.kill(node.node_id)

    def wait_in_sync(self, timeout_s: float = IN_SYNC_TIMEOUT_S) -> None:
        """Until every partition of every topic has a leader and all its replicas in sync."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        wait_until(lambda: not out_of_sync(admin), "every replica is in sync", timeout_s=timeout_s)

    def _launch(self, node: ClusterNode) -> None:
        assert not node.running, f"node {node.node_id} runs already"
        voters = [each.quorum for each in self.nodes]
        node.process = launch_node(node.home, node.quorum, voters, overrides=REPLICATED, heap_mb=NODE_HEAP_MB)

    def _wait_ready(self, node: ClusterNode) -> None:
        assert node.process is not None
        wait_node_ready(node.process, node.quorum.port, node.home / "broker.log")

    def _pid(self, node_id: int) -> int:
        process = self.node(node_id).process
        assert process is not None, f"node {node_id} was never started"
        return process.pid


def out_of_sync(admin: AdminClient) -> list[str]:
    """The partitions (`topic/partition`) without a leader or with a replica out of the ISR; every one when
    the cluster does not answer."""
    try:
        topics = admin.list_topics(timeout=5).topics
    except Exception as exc:  # no answer is as out of sync as can be
        return [f"no metadata: {exc}"]
    return [
        f"{name}/{number}"
        for name, topic in topics.items()
        for number, partition in topic.partitions.items()
        if partition.leader < 0 or set(partition.isrs) != set(partition.replicas)
    ]


@contextmanager
def kafka_cluster(root: Path) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster.on_free_ports(root)
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.kill_all()

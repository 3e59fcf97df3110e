"""The project's topics on a three-node cluster: three replicas, and two of them in sync for the relay's
`acks=all` writes to be acknowledged, so that losing one node loses nothing acknowledged and stops nothing."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType

from pin_identity.adapters.kafka.publisher import producer_config
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics, replication_shortfall
from pin_identity.domain.events import PUBLISHED_TOPICS
from tests.support.cluster import KafkaCluster, out_of_sync
from tests.support.waiting import wait_until


def _topic_setting(bootstrap: str, topic: str, name: str) -> tuple[str, bool]:
    """The topic's value of a setting, and whether it is the topic's own (not the broker's, which the test
    cluster sets as a production cluster would)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    entry = future.result()[name]
    return entry.value, entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def _settled_setting(bootstrap: str, topic: str, name: str) -> tuple[str, bool]:
    """`_topic_setting` once the node asked knows the topic: each node learns of a new topic on its own."""
    found: list[tuple[str, bool]] = []

    def read() -> bool:
        try:
            found.append(_topic_setting(bootstrap, topic, name))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            return False
        return True

    wait_until(read, f"the node asked knows {topic}", timeout_s=30)
    return found[-1]


def test_topics_created_with_three_replicas_keep_two_in_sync_and_the_relay_waits_for_all(
    cluster: KafkaCluster,
) -> None:
    ensure_topics({"bootstrap.servers": cluster.bootstrap}, PUBLISHED_TOPICS, TopicLayout(3, 3))
    for topic in PUBLISHED_TOPICS:
        assert _settled_setting(cluster.bootstrap, topic, "min.insync.replicas") == ("2", True), topic
        assert _settled_setting(cluster.bootstrap, topic, "cleanup.policy") == ("compact", True), topic
    cluster.wait_in_sync()
    topics = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10).topics
    assert {
        len(partition.replicas)
        for topic in PUBLISHED_TOPICS
        for partition in topics[topic].partitions.values()
    } == {3}
    assert producer_config({})["acks"] == "all"
    assert producer_config({})["enable.idempotence"] is True


def test_a_killed_node_leaves_replicas_out_of_sync_until_it_is_started_again(cluster: KafkaCluster) -> None:
    ensure_topics({"bootstrap.servers": cluster.bootstrap}, PUBLISHED_TOPICS, TopicLayout(3, 3))
    cluster.wait_in_sync()
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    cluster.kill(3)
    wait_until(lambda: out_of_sync(admin) != [], "the killed node's replicas leave the ISR")
    ours = len(PUBLISHED_TOPICS) * 3  # every partition of ours has a replica on each node
    wait_until(lambda: len(out_of_sync(admin)) == ours, "every partition has two replicas in sync")
    # Two in sync where two are needed: the broker takes writes, the relay has nothing to warn of.
    assert replication_shortfall({"bootstrap.servers": cluster.bootstrap}, PUBLISHED_TOPICS) is None
    began = time.monotonic()
    cluster.start(3)
    cluster.wait_in_sync()
    print(f"node 3 started and every replica in sync in {time.monotonic() - began:.1f} s")
    # Each node updates its metadata on its own: the client that saw the kill asks whichever node it likes.
    wait_until(
        lambda: out_of_sync(admin) == [], "every node's metadata says all replicas are in sync", timeout_s=30
    )

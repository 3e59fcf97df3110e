"""Creating our topics: compacted, with the configured partitions and replication."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic


@dataclass(frozen=True)
class TopicLayout:
    partitions: int
    replication_factor: int


def ensure_topics(
    client_config: dict[str, str], names: Iterable[str], layout: TopicLayout, *, timeout_s: float = 15.0
) -> list[str]:
    """Create the missing topics; returns the names created (an existing topic is left as it is)."""
    admin = AdminClient({**client_config})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [name for name in names if name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [
            NewTopic(name, layout.partitions, layout.replication_factor, config={"cleanup.policy": "compact"})
            for name in missing
        ],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created


def broker_reachable(client_config: dict[str, str], timeout_s: float = 3.0) -> bool:
    try:
        AdminClient({**client_config}).list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False

"""How far a consumer group is behind on its topics, read from the broker without joining the group: the
group's committed offsets against the partitions' high watermarks. Inside a `worker` running talent-sync the
consumer reports the same figure as `talent_sync_consumer_lag`; any other process (`serve`) asks the
broker."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pin_identity.adapters.kafka.client_log import silenced
from pin_identity.adapters.kafka.consumers import new_consumer
from pin_identity.adapters.kafka.denials import DenialLog, denial, group_denial
from pin_identity.adapters.kafka.offsets import watermarks
from pin_identity.adapters.kafka.topics import failure_reason
from pin_identity.domain.errors import BrokerUnavailableError
from pin_identity.operations.ports.health_sources import PartitionLagView

# librdkafka would write its own log lines to stderr: the caller reports the failure as one line instead.
_quiet = silenced("group_lag")
_denials = DenialLog("serve")


class KafkaConsumerLag:
    """ConsumerLagReader over the broker. `client_config` is asked at each read: it may raise
    BrokerUnavailableError itself (no broker configured)."""

    def __init__(self, client_config: Callable[[], Mapping[str, str]], *, timeout_s: float = 3.0):
        self._client_config, self._timeout_s = client_config, timeout_s

    def partition_lags(self, group: str, topics: Sequence[str]) -> list[PartitionLagView]:
        return consumer_group_lag(self._client_config(), group, topics, timeout_s=self._timeout_s)


def consumer_group_lag(
    client_config: Mapping[str, str], group: str, topics: Sequence[str], *, timeout_s: float = 3.0
) -> list[PartitionLagView]:
    """Every partition of those `topics` that exist: records the group has not consumed yet. Raises
    BrokerUnavailableError when the broker does not answer in time, or refuses."""
    consumer = new_consumer(client_config, {"group.id": group, "enable.auto.commit": False, "logger": _quiet})
    try:
        partitions = _partitions(consumer, topics, timeout_s)
        if not partitions:
            return []
        committed = consumer.committed(partitions, timeout=timeout_s)
        return [_lag(consumer, stored, timeout_s) for stored in committed]
    except KafkaException as exc:
        refused = denial(exc, "Describe", group) or group_denial(consumer, "Describe", group)
        raise BrokerUnavailableError(str(_denials.say(refused) or failure_reason(exc))) from None
    finally:
        consumer.close()


def _partitions(consumer: Consumer, topics: Sequence[str], timeout_s: float) -> list[TopicPartition]:
    known = consumer.list_topics(timeout=timeout_s).topics
    return [
        TopicPartition(topic, partition)
        for topic in topics
        if topic in known and known[topic].error is None
        for partition in sorted(known[topic].partitions)
    ]


def _lag(consumer: Consumer, stored: TopicPartition, timeout_s: float) -> PartitionLagView:
    low, high = watermarks(consumer, stored, timeout_s)
    committed = stored.offset if stored.offset >= 0 else None
    # With nothing committed the group starts from the beginning (auto.offset.reset = earliest).
    at = committed if committed is not None else low
    return PartitionLagView(
        topic=stored.topic, partition=stored.partition, lag=max(high - at, 0), committed_offset=committed
    )

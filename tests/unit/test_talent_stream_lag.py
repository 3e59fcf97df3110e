"""The continuous consumer's lag while the group's coordinator is away (its node stopped or lost, the
coordinator moving): unknown for a while, never an exception that would end the talent-sync job and its
worker. tests/acceptance/test_cluster_talent.py shows it on a three-node cluster."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pin_identity.adapters.kafka import talent_stream
from pin_identity.adapters.kafka.talent_stream import KafkaTalentStream


class _CoordinatorAway:
    """A consumer whose partitions are assigned but whose group coordinator does not answer."""

    def __init__(self, error: int):
        self._error = error

    def subscribe(self, topics: list[str]) -> None:
        pass

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("talent.identity.users.v1", 0)]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        raise KafkaException(KafkaError(self._error))


@pytest.mark.parametrize(
    "error", [KafkaError._TIMED_OUT, KafkaError.NOT_COORDINATOR], ids=["timed-out", "not-coordinator"]
)
def test_a_coordinator_that_does_not_answer_leaves_the_lag_unknown(
    monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    def away(*_: Any, **__: Any) -> _CoordinatorAway:
        return _CoordinatorAway(error)

    monkeypatch.setattr(talent_stream, "new_consumer", away)
    stream = KafkaTalentStream({"bootstrap.servers": "kafka:9093"})

    assert stream.lag() is None

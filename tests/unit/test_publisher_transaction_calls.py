"""How the relay's publisher drives librdkafka's transactional calls, over a producer that records them.

librdkafka 2.16 aborts the process when a commit_transaction() whose first phase timed out is followed by the
EndTxn's answer before the next call (docs/librdkafka-txn-abort.md). A first phase cannot time out within a
second, so the publisher never gives commit or abort less; and it drains what is in flight with poll(), never
by stepping a commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

from pin_identity.adapters.kafka import publisher as publisher_module
from pin_identity.adapters.kafka.publisher import KafkaEventPublisher
from pin_identity.operations.ports.outbox import PendingEvent

Delivery = Callable[[KafkaError | None, Any], None]


class _Message:
    def __init__(self, topic: str, key: bytes):
        self._topic, self._key = topic, key

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes:
        return self._key

    def partition(self) -> int:
        return 0


class _Metadata:
    topics: ClassVar[dict[str, Any]] = {}


class RecordingProducer:
    """Answers at most `ANSWERS_PER_POLL` events per poll(): what was produced stays in flight for a while,
    as with a broker."""

    ANSWERS_PER_POLL = 4

    made: ClassVar[list[RecordingProducer]] = []

    def __init__(self, config: dict[str, Any]):
        self.calls: list[tuple[str, float, int]] = []  # (call, timeout, events in flight then)
        self.in_flight: list[tuple[str, bytes, Delivery]] = []
        self.commit_error: KafkaError | None = None
        RecordingProducer.made.append(self)

    def __len__(self) -> int:
        return len(self.in_flight)

    def init_transactions(self, timeout: float) -> None:
        self.calls.append(("init_transactions", timeout, len(self)))

    def begin_transaction(self) -> None:
        self.calls.append(("begin_transaction", 0, len(self)))

    def produce(self, topic: str, value: bytes, key: bytes, **kwargs: Any) -> None:
        self.in_flight.append((topic, key, kwargs["on_delivery"]))

    def poll(self, timeout: float) -> int:
        answered = self.in_flight[: self.ANSWERS_PER_POLL]
        del self.in_flight[: self.ANSWERS_PER_POLL]
        for topic, key, on_delivery in answered:
            on_delivery(None, _Message(topic, key))
        return len(answered)

    def flush(self, timeout: float) -> int:
        self.poll(timeout)
        return 0

    def purge(self, *args: Any, **kwargs: Any) -> None:
        self.in_flight = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        """A broker whose metadata names no topic: the publisher leaves the partition to librdkafka."""
        return _Metadata()

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append(("commit_transaction", timeout, len(self)))
        if self.commit_error is not None:
            raise KafkaException(self.commit_error)

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append(("abort_transaction", timeout, len(self)))


@pytest.fixture
def producers(monkeypatch: pytest.MonkeyPatch) -> list[RecordingProducer]:
    RecordingProducer.made = []
    monkeypatch.setattr(publisher_module, "Producer", RecordingProducer)
    return RecordingProducer.made


def _events(first: int, count: int) -> list[PendingEvent]:
    return [PendingEvent(n, "t", f"k{n}", b"{}", "E", "c", None) for n in range(first, first + count)]


def _publisher() -> KafkaEventPublisher:
    return KafkaEventPublisher({"bootstrap.servers": "unused:9092"}, None, transactional_id="relay")


def test_commit_and_abort_get_a_second_at_least_and_commit_only_once_nothing_is_in_flight(
    producers: list[RecordingProducer],
) -> None:
    publisher = _publisher()
    publisher.start()
    delivered: list[int] = []
    for batch in range(3):  # as the relay: a batch, collect(0), then a wait for the answers
        publisher.send(_events(batch * 10 + 1, 10))
        delivered += publisher.collect(0).delivered
        for _ in range(5):
            delivered += publisher.collect(0.05).delivered
    assert sorted(delivered) == [n for batch in range(3) for n in range(batch * 10 + 1, batch * 10 + 11)]
    ends = [call for call in producers[0].calls if call[0] in ("commit_transaction", "abort_transaction")]
    assert ends, "no transaction ended"
    assert all(timeout >= 1.0 and in_flight == 0 for _, timeout, in_flight in ends), ends


def test_a_commit_refused_for_its_state_replaces_the_producer_and_sends_the_events_again(
    producers: list[RecordingProducer],
) -> None:
    """_STATE says librdkafka lost track of its own transaction calls, not that another relay took over."""
    publisher = _publisher()
    publisher.start()
    publisher.send(_events(1, 3))
    producers[0].commit_error = KafkaError(KafkaError._STATE)
    publisher.collect(0)
    report = publisher.collect(0.05)
    assert sorted(report.retry) == [1, 2, 3]
    assert not report.delivered
    publisher.send(_events(1, 3))
    assert len(producers) == 2  # a new producer (whose init_transactions() fences the old one's)

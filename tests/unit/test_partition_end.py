"""A partition is read to its end only once a record or an end-of-partition signal reaches the end offset
taken when the read began. A fetch from a follower, or from a leader just elected, can report an end below
it: that end of partition is a step of the read, not its end. Each reader of the project is shown the same
picture, an in-memory consumer whose partition says "end" at offset 5 of 10 and then delivers the other
five records."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from pin_identity.adapters.kafka import consumers
from pin_identity.adapters.kafka.access_log import KafkaAccessLog
from pin_identity.adapters.kafka.access_lookup import KafkaUserAccessLog
from pin_identity.adapters.kafka.reader import TopicReader
from pin_identity.adapters.kafka.replay_source import TopicReplaySource
from pin_identity.domain.access_verdicts import LastEvent
from pin_identity.domain.talent import ImportStage

TOPIC = "some.topic"
END = 10  # the partition's end offset when the read begins
BEHIND = 5  # the end a lagging replica reports on the way
USERS = [uuid.uuid4() for _ in range(END)]


def _record(offset: int) -> Message:
    body = b'{"payload": {"activeAssignments": []}}'
    return Message(topic=TOPIC, partition=0, offset=offset, key=str(USERS[offset]).encode(), value=body)


def _end_of_partition(offset: int) -> Message:
    return Message(topic=TOPIC, partition=0, offset=offset, error=KafkaError(KafkaError._PARTITION_EOF))


def _deliveries() -> list[list[Message]]:
    """What consume() hands over, one batch a call: half the partition and an end reported below the end
    offset, then the rest and the true end."""
    return [
        [_record(n) for n in range(BEHIND)] + [_end_of_partition(BEHIND)],
        [_record(n) for n in range(BEHIND, END)] + [_end_of_partition(END)],
    ]


class FakeConsumer:
    """The calls the readers make of confluent_kafka's Consumer, over one partition of one topic."""

    def __init__(self, config: dict[str, Any]):
        self.batches = _deliveries()

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        described = SimpleNamespace(partitions={0: object()}, error=None)
        return SimpleNamespace(topics={TOPIC: described})

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        return 0, END

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        pass

    def unassign(self) -> None:
        pass

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        pass

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        return self.batches.pop(0) if self.batches else []

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def fake_consumers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(consumers, "Consumer", FakeConsumer)
    yield


def test_the_audit_reads_past_an_end_reported_below_the_end_offset() -> None:
    kept: list[LastEvent] = []
    read = KafkaAccessLog({}, topic=TOPIC, stall_s=1.0).read(kept.extend, lambda done, total: None)
    assert (read.records, read.incomplete) == (END, [])
    assert [user for user, _ in kept] == [user.bytes for user in USERS]


def test_access_show_finds_a_user_past_an_end_reported_below_the_end_offset() -> None:
    search = KafkaUserAccessLog({}, topic=TOPIC, timeout_s=1.0).last_event(USERS[END - 2])
    assert search.last_event is not None, "the user's event lies past the early end"
    assert (search.last_event.offset, search.records_read) == (END - 2, END)


def test_a_replay_page_is_not_closed_short_by_an_end_reported_below_its_end() -> None:
    source = TopicReplaySource({}, tenants_topic="tenants", users_topic=TOPIC)
    [page] = source.plan(ImportStage.USERS, None, 0, END, None).pages
    items = source.read(ImportStage.USERS, page.cursor, END, None)
    assert [item.talent_id for item in items] == USERS


def test_the_reader_reads_past_an_end_reported_below_the_end_offset() -> None:
    events = TopicReader({}, [TOPIC], from_beginning=True).read_to_end(timeout_s=1.0)
    assert [event.offset for event in events] == list(range(END))

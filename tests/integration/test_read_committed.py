"""Every reader of the project reads committed, whatever PIN_IDENTITY_KAFKA_CONFIG says: a copied Java-style
`isolation.level=read_uncommitted` would otherwise have them read an aborted transaction's events (the relay
aborts a transaction and sends all of it again, so such an event is never published). On the embedded broker,
one record of an aborted transaction followed by one of a committed transaction, read by each reader with
read_uncommitted in its configuration: only the committed one is seen."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pin_identity.adapters.kafka.access_log import KafkaAccessLog
from pin_identity.adapters.kafka.access_lookup import KafkaUserAccessLog
from pin_identity.adapters.kafka.reader import TopicReader
from pin_identity.adapters.kafka.replay_source import TopicReplaySource
from pin_identity.adapters.kafka.talent_stream import KafkaTalentStream
from pin_identity.domain.talent import ImportStage
from tests.support.waiting import wait_until


@dataclass(frozen=True)
class Written:
    """Two fresh topics (Talent's two, for the readers of those) and the keys of the two records on the
    second: `aborted`, then `committed`, in its one partition."""

    first_topic: str
    topic: str
    aborted: uuid.UUID
    committed: uuid.UUID


def _record(key: uuid.UUID) -> bytes:
    return json.dumps({"payload": {"activeAssignments": []}, "userId": str(key)}).encode()


@pytest.fixture
def written(broker: str) -> Written:
    suffix = uuid.uuid4().hex[:10]
    first, topic = f"read-committed.first.{suffix}", f"read-committed.{suffix}"
    admin = AdminClient({"bootstrap.servers": broker})
    for future in admin.create_topics([NewTopic(name, 1, 1) for name in (first, topic)]).values():
        future.result()
    aborted, committed = uuid.uuid4(), uuid.uuid4()
    producer = Producer({"bootstrap.servers": broker, "transactional.id": f"read-committed-{suffix}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key=str(aborted), value=_record(aborted))
    assert producer.flush(30) == 0
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, key=str(committed), value=_record(committed))
    producer.commit_transaction(30)
    return Written(first, topic, aborted, committed)


Reader = Callable[[dict[str, str], Written], set[uuid.UUID]]


def _topic_reader(config: dict[str, str], written: Written) -> set[uuid.UUID]:
    reader = TopicReader(config, [written.topic], from_beginning=True)
    try:
        return {uuid.UUID(event.key) for event in reader.read_to_end()}
    finally:
        reader.close()


def _audit(config: dict[str, str], written: Written) -> set[uuid.UUID]:
    kept: set[uuid.UUID] = set()
    KafkaAccessLog(config, topic=written.topic).read(
        lambda records: kept.update(uuid.UUID(bytes=user) for user, _ in records), lambda done, total: None
    )
    return kept


def _access_show(config: dict[str, str], written: Written) -> set[uuid.UUID]:
    log = KafkaUserAccessLog(config, topic=written.topic)
    return {user for user in (written.aborted, written.committed) if log.last_event(user).last_event}


def _topic_replay(config: dict[str, str], written: Written) -> set[uuid.UUID]:
    source = TopicReplaySource(config, tenants_topic=written.first_topic, users_topic=written.topic)
    try:
        pages = source.plan(ImportStage.USERS, None, 0, 100, None).pages
        items = [item for page in pages for item in source.read(ImportStage.USERS, page.cursor, 100, None)]
    finally:
        source.close()
    return {item.talent_id for item in items if item.talent_id is not None}


def _talent_sync(config: dict[str, str], written: Written) -> set[uuid.UUID]:
    stream = KafkaTalentStream(
        config,
        tenants_topic=written.first_topic,
        users_topic=written.topic,
        overrides={"group.id": f"read-committed-{uuid.uuid4().hex[:10]}"},
    )
    seen: set[uuid.UUID] = set()

    def committed_consumed() -> bool:
        seen.update(record.item.talent_id for record in stream.poll(100, 0.2) if record.item.talent_id)
        return written.committed in seen

    try:
        # The committed record lies after the aborted one: once it is in, the other was delivered or skipped.
        wait_until(committed_consumed, "the committed record is consumed")
    finally:
        stream.close()
    return seen


READERS: dict[str, Reader] = {
    "topic-reader": _topic_reader,
    "access-audit": _audit,
    "access-show": _access_show,
    "topic-replay": _topic_replay,
    "talent-sync": _talent_sync,
}


@pytest.mark.parametrize("read", READERS.values(), ids=READERS.keys())
def test_an_aborted_transactions_record_is_not_read_even_when_the_config_says_read_uncommitted(
    broker: str, written: Written, read: Reader
) -> None:
    config = {"bootstrap.servers": broker, "isolation.level": "read_uncommitted"}
    assert read(config, written) == {written.committed}

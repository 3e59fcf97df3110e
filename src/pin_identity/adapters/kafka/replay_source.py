"""TopicReplay: Talent's compacted topics as the import's source.

A page is an offset range of one partition, cut at the end offsets seen at planning, so a replay reads a fixed
picture of the topics however much is produced meanwhile. Reading assigns partitions (no consumer group);
when a complete replay ends, the continuous consumer's group is moved to where the replay ended, if nobody in
the group is consuming (a group with live members cannot have its offsets altered; a live consumer is applying
the same snapshots anyway, and the version guard makes the overlap harmless).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from pin_identity.adapters.kafka.talent_stream import TALENT_SYNC_GROUP
from pin_identity.adapters.talent_wire import decode_topic_value
from pin_identity.domain.talent import TENANTS_TOPIC, USERS_TOPIC, ImportStage, RawSnapshot
from pin_identity.domain.talent_import import PlannedPage, PlanStep
from pin_identity.jobs.ports import SourceUnavailableError
from pin_identity.observability.logging import get_logger

log = get_logger("talent-replay")

_READ_TIMEOUT_S = 60.0


def _range_cursor(topic: str, partition: int, start: int, end: int) -> str:
    return json.dumps({"topic": topic, "partition": partition, "start": start, "end": end})


def _parse_cursor(cursor: str | None) -> tuple[str, int, int, int]:
    if cursor is None:
        raise SourceUnavailableError("a topic-replay page has no offset range")
    parsed = json.loads(cursor)
    return str(parsed["topic"]), int(parsed["partition"]), int(parsed["start"]), int(parsed["end"])


class TopicReplaySource:
    def __init__(
        self,
        client_config: dict[str, str],
        *,
        tenants_topic: str = TENANTS_TOPIC,
        users_topic: str = USERS_TOPIC,
        group_id: str = TALENT_SYNC_GROUP,
    ):
        self._config = client_config
        self._topics = {ImportStage.TENANTS: tenants_topic, ImportStage.USERS: users_topic}
        self._group_id = group_id
        self._reader: Consumer | None = None

    def _consumer(self) -> Consumer:
        if self._reader is None:
            self._reader = Consumer(
                {
                    **self._config,
                    "group.id": "pin-identity-talent-import",  # never joined: partitions are assigned
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    # A page is a range that already exists: waiting for more data (500 ms by default) after
                    # its last record would only add that wait to every page.
                    "fetch.wait.max.ms": 10,
                }
            )
        return self._reader

    def _partitions(self, topic: str) -> list[int]:
        metadata = self._consumer().list_topics(topic, timeout=10)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            raise SourceUnavailableError(f"topic {topic} does not exist")
        return sorted(described.partitions)

    def _watermarks(self, topic: str) -> list[tuple[int, int, int]]:
        try:
            return [
                (p, *self._consumer().get_watermark_offsets(TopicPartition(topic, p), timeout=10))
                for p in self._partitions(topic)
            ]
        except KafkaException as exc:
            raise SourceUnavailableError(f"offsets of {topic} cannot be read: {exc}") from None

    def check(self) -> None:
        for topic in self._topics.values():
            self._watermarks(topic)
        self._check_compacted()

    def _check_compacted(self) -> None:
        admin = AdminClient(dict(self._config.items()))
        resources = [ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in self._topics.values()]
        try:
            for resource, future in admin.describe_configs(resources).items():
                policy = future.result(timeout=10).get("cleanup.policy")
                if policy is None or "compact" not in str(policy.value):
                    raise SourceUnavailableError(f"topic {resource.name} is not compacted: use api-pull")
        except KafkaException as exc:
            raise SourceUnavailableError(f"topic configuration cannot be read: {exc}") from None

    def count_companies(self, tenant_filter: UUID | None) -> int | None:
        """An upper bound (compaction leaves gaps, tombstones count): the guard only catches a source that is
        far too small, so an upper bound errs on the safe side."""
        if tenant_filter is not None:
            return None
        return sum(high - low for _, low, high in self._watermarks(self._topics[ImportStage.TENANTS]))

    def plan(
        self, stage: ImportStage, cursor: str | None, page_no: int, page_size: int, tenant_filter: UUID | None
    ) -> PlanStep:
        """A stage's pages in one step. Both topics' ends are fixed when the Tenants stage is planned: the
        Users stage (planned later, after the barrier) stops where the users topic ended then, so a user
        produced after the tenants were read is left to the continuous consumer with its possibly new tenant,
        and the handover does not move the consumer past it."""
        topic = self._topics[stage]
        fixed_ends = {int(p): int(end) for p, end in json.loads(cursor).items()} if cursor else {}
        pages: list[PlannedPage] = []
        for partition, low, high in self._watermarks(topic):
            end_of_listing = fixed_ends.get(partition, high)
            for start in range(low, end_of_listing, page_size):
                end = min(start + page_size, end_of_listing)
                pages.append(
                    PlannedPage(page_no + len(pages), _range_cursor(topic, partition, start, end), 0)
                )
        if stage is ImportStage.TENANTS:
            users_ends = {str(p): high for p, _, high in self._watermarks(self._topics[ImportStage.USERS])}
            return PlanStep(pages, json.dumps(users_ends), complete=True)
        return PlanStep(pages, None, complete=True)

    def read(
        self, stage: ImportStage, cursor: str | None, page_size: int, tenant_filter: UUID | None
    ) -> list[RawSnapshot]:
        topic, partition, start, end = _parse_cursor(cursor)
        consumer = self._consumer()
        consumer.assign([TopicPartition(topic, partition, start)])
        try:
            return self._read_until(consumer, start, end, time.monotonic() + _READ_TIMEOUT_S)
        finally:
            consumer.unassign()

    def _read_until(self, consumer: Consumer, start: int, end: int, deadline: float) -> list[RawSnapshot]:
        records: list[RawSnapshot] = []
        next_offset = start
        while time.monotonic() < deadline:
            # Ask for no more than the range still holds: consume() returns as soon as it has that many.
            for message in consumer.consume(max(end - next_offset, 1), 0.5):
                if _ends_range(message, end):
                    return records
                records.append(_snapshot(message))
                next_offset = (message.offset() or 0) + 1
                if next_offset >= end:
                    return records
        raise SourceUnavailableError("timed out reading a topic-replay page")

    def handover(self, cursors: Sequence[str | None]) -> None:
        ends: dict[tuple[str, int], int] = {}
        for cursor in cursors:
            topic, partition, _, end = _parse_cursor(cursor)
            ends[(topic, partition)] = max(ends.get((topic, partition), 0), end)
        if ends:
            self._commit_group(ends)

    def _commit_group(self, ends: dict[tuple[str, int], int]) -> None:
        group = Consumer({**self._config, "group.id": self._group_id, "enable.auto.commit": False})
        try:
            wanted = [TopicPartition(t, p, end) for (t, p), end in sorted(ends.items())]
            current = {(tp.topic, tp.partition): tp.offset for tp in group.committed(wanted, timeout=10)}
            ahead = [tp for tp in wanted if tp.offset > current.get((tp.topic, tp.partition), -1)]
            if ahead:
                group.commit(offsets=ahead, asynchronous=False)
            log.info("import-handover", group=self._group_id, partitions_moved=len(ahead))
        except KafkaException as exc:
            log.info("import-handover-skipped", group=self._group_id, reason=str(exc.args[0]))
        finally:
            group.close()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _ends_range(message: Message, end: int) -> bool:
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            return True
        raise SourceUnavailableError(f"reading a topic-replay page failed: {error.str()}")
    return (message.offset() or 0) >= end


def _snapshot(message: Message) -> RawSnapshot:
    key = message.key()
    value: Any = decode_topic_value(message.value())
    return RawSnapshot(key.decode("utf-8", errors="replace") if isinstance(key, bytes) else key, value)

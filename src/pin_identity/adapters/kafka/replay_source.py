"""TopicReplay: Talent's compacted topics as the import's source.

A page is an offset range of one partition, cut at the end offsets seen at planning, so a replay reads a fixed
picture of the topics however much is produced meanwhile. Reading assigns partitions (no consumer group);
when a complete replay ends, the continuous consumer's group is moved to where the replay ended, if nobody in
the group is consuming (a group with live members cannot have its offsets altered; a live consumer is applying
the same snapshots anyway, and the version guard makes the overlap harmless).

The reader keeps its consumer positioned where its last page ended: the import claims a partition's pages in
order, so the next page is usually the next range of the same partition, and the consumer has fetched it while
the last one was applied. Any other page repositions the consumer. Offsets and metadata are looked up on a
client of their own, so that they never wait behind the reader's fetches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple
from uuid import UUID

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from pin_identity.adapters.kafka.client_log import with_client_log
from pin_identity.adapters.kafka.consumers import new_consumer
from pin_identity.adapters.kafka.denials import Denial, DenialLog, denial, group_denial
from pin_identity.adapters.kafka.offsets import end_reached, watermarks
from pin_identity.adapters.kafka.talent_stream import TALENT_SYNC_GROUP
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.adapters.talent_wire import topic_item
from pin_identity.domain.errors import SourceUnavailableError
from pin_identity.domain.import_run import PlannedPage, PlanStep
from pin_identity.domain.talent import TENANTS_TOPIC, USERS_TOPIC, ImportStage, TalentItem
from pin_identity.observability.logging import get_logger

log = get_logger("talent-replay")

_READ_TIMEOUT_S = 60.0
_CLIENT_GROUP = "pin-identity-talent-import"  # never joined: partitions are assigned
# One for the process: an import's sources come and go with its pages, a denial lasts across them.
_denials = DenialLog("talent-import")

# How the reader fetches (BENCHMARKS.md, "TopicReplay"):
# - fetch.wait.max.ms: a fetch waits for new data only at the end of a partition, but librdkafka keeps one
#   fetch in flight per broker, so the first page of the next partition waits behind it (500 ms by default).
# - queued.min.messages: about one page of the largest size (2,000) is fetched ahead while the last page is
#   applied, topped up in small steps (fetch.queue.backoff.ms) rather than in bursts that compete with it.
_READER_SETTINGS: dict[str, str | int | bool] = {
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
    "fetch.wait.max.ms": 50,
    "queued.min.messages": 2_000,
    "fetch.queue.backoff.ms": 10,
}


def _range_cursor(topic: str, partition: int, start: int, end: int) -> str:
    return json.dumps({"topic": topic, "partition": partition, "start": start, "end": end})


class _Range(NamedTuple):
    """A page: an offset range of one partition."""

    topic: str
    partition: int
    start: int
    end: int


def _parse_cursor(cursor: str | None) -> _Range:
    if cursor is None:
        raise SourceUnavailableError("a topic-replay page has no offset range")
    parsed = json.loads(cursor)
    return _Range(str(parsed["topic"]), int(parsed["partition"]), int(parsed["start"]), int(parsed["end"]))


@dataclass
class _Position:
    """Where the reader's consumer stands: the next offset of one partition, and what it already delivered
    past the last page (a record after a compaction gap, the end of the partition), kept for the next one."""

    topic: str
    partition: int
    offset: int
    carried: list[Message] = field(default_factory=list)

    def continues(self, page: _Range) -> bool:
        return (self.topic, self.partition, self.offset) == (page.topic, page.partition, page.start)


class TopicReplaySource:
    def __init__(
        self,
        client_config: dict[str, str],
        *,
        tenants_topic: str = TENANTS_TOPIC,
        users_topic: str = USERS_TOPIC,
        group_id: str = TALENT_SYNC_GROUP,
    ):
        self._config = with_client_log(client_config)
        self._topics = {ImportStage.TENANTS: tenants_topic, ImportStage.USERS: users_topic}
        self._group_id = group_id
        self._reader: Consumer | None = None
        self._lookups: Consumer | None = None
        self._position: _Position | None = None

    def _consumer(self) -> Consumer:
        if self._reader is None:
            self._reader = new_consumer(self._config, {"group.id": _CLIENT_GROUP, **_READER_SETTINGS})
        return self._reader

    def _lookup(self) -> Consumer:
        if self._lookups is None:
            self._lookups = new_consumer(
                self._config, {"group.id": _CLIENT_GROUP, "enable.auto.commit": False}
            )
        return self._lookups

    def _partitions(self, topic: str) -> list[int]:
        metadata = self._lookup().list_topics(topic, timeout=10)
        described = metadata.topics.get(topic)
        refused = _denials.say(denial(described.error if described else None, "Describe", topic))
        if refused is not None:
            raise SourceUnavailableError(str(refused))
        if described is None or described.error is not None or not described.partitions:
            raise SourceUnavailableError(f"topic {topic} does not exist")
        return sorted(described.partitions)

    def _watermarks(self, topic: str) -> list[tuple[int, int, int]]:
        try:
            return [
                (p, *watermarks(self._lookup(), TopicPartition(topic, p))) for p in self._partitions(topic)
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
            refused = _denials.say(denial(exc, "DescribeConfigs", self._topics.values()))
            reason = str(refused) if refused else f"topic configuration cannot be read: {exc}"
            raise SourceUnavailableError(reason) from None

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
    ) -> list[TalentItem]:
        page = _parse_cursor(cursor)
        carried = self._positioned(page)
        self._position = None  # until the page is read: a failed read leaves the consumer anywhere
        items, carried = self._read_until(stage, page, carried, SYSTEM_CLOCK.monotonic() + _READ_TIMEOUT_S)
        self._position = _Position(page.topic, page.partition, page.end, carried)
        self._release_at_end(page)
        return items

    def _positioned(self, page: _Range) -> list[Message]:
        """The consumer at the page's start; what it already delivered from there when it stood there."""
        if self._position is not None and self._position.continues(page):
            return self._position.carried
        self._position = None
        # assign() replaces the whole assignment: the last partition is no longer fetched.
        self._consumer().assign([TopicPartition(page.topic, page.partition, page.start)])
        return []

    def _read_until(
        self, stage: ImportStage, page: _Range, carried: list[Message], deadline: float
    ) -> tuple[list[TalentItem], list[Message]]:
        """The range's items, and what was delivered after its end."""
        items: list[TalentItem] = []
        next_offset = page.start
        while SYSTEM_CLOCK.monotonic() < deadline:
            # Ask for no more than the range still holds: consume() returns as soon as it has that many.
            messages = carried or self._consumer().consume(max(page.end - next_offset, 1), 0.5)
            carried = []
            for index, message in enumerate(messages):
                if not _belongs(message, page, next_offset):
                    continue
                if _within(message, page):
                    items.append(topic_item(stage, message.key(), message.value()))
                    next_offset = (message.offset() or 0) + 1
                elif end_reached(message, page.end):  # past the range, or its partition's end: kept
                    return items, messages[index:]
                if next_offset >= page.end:
                    return items, messages[index + 1 :]
        raise SourceUnavailableError("timed out reading a topic-replay page")

    def _release_at_end(self, page: _Range) -> None:
        """A partition read to its end is let go: an idle consumer would keep asking the broker for more."""
        where = TopicPartition(page.topic, page.partition)
        try:  # what the last fetch response said: no request is sent
            _, high = self._consumer().get_watermark_offsets(where, cached=True)
        except KafkaException:
            return
        if 0 <= high <= page.end:
            self._consumer().unassign()
            self._position = None

    def handover(self, cursors: Sequence[str | None]) -> None:
        ends: dict[tuple[str, int], int] = {}
        for cursor in cursors:
            topic, partition, _, end = _parse_cursor(cursor)
            ends[(topic, partition)] = max(ends.get((topic, partition), 0), end)
        if ends:
            self._commit_group(ends)

    def _commit_group(self, ends: dict[tuple[str, int], int]) -> None:
        group = new_consumer(self._config, {"group.id": self._group_id, "enable.auto.commit": False})
        try:
            wanted = [TopicPartition(t, p, end) for (t, p), end in sorted(ends.items())]
            current = {(tp.topic, tp.partition): tp.offset for tp in group.committed(wanted, timeout=10)}
            ahead = [tp for tp in wanted if tp.offset > current.get((tp.topic, tp.partition), -1)]
            if ahead:
                group.commit(offsets=ahead, asynchronous=False)
            log.info("import-handover", group=self._group_id, partitions_moved=len(ahead))
        except KafkaException as exc:
            _denials.say(denial(exc, "Read", self._group_id) or group_denial(group, "Read", self._group_id))
            log.info("import-handover-skipped", group=self._group_id, reason=str(exc.args[0]))
        finally:
            group.close()

    def close(self) -> None:
        for client in (self._reader, self._lookups):
            if client is not None:
                client.close()
        self._reader = self._lookups = None
        self._position = None


def _belongs(message: Message, page: _Range, next_offset: int) -> bool:
    """False for a record or an end of partition delivered for an earlier position of the consumer; any other
    error is the page's to raise."""
    error = message.error()
    if error is not None and error.code() != KafkaError._PARTITION_EOF:
        return True
    if (message.topic(), message.partition()) != (page.topic, page.partition):
        return False
    return error is not None or (message.offset() or 0) >= next_offset


def _within(message: Message, page: _Range) -> bool:
    """A record below the range's end; an end of partition is not (offsets.py says whether it ends the
    range); any other error fails the page."""
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            return False
        refused = _denials.say(_page_denial(error, page))
        raise SourceUnavailableError(str(refused or f"reading a topic-replay page failed: {error.str()}"))
    return (message.offset() or 0) < page.end


def _page_denial(error: KafkaError, page: _Range) -> Denial | None:
    """The reader names a group it never joins, and librdkafka still looks for that group's coordinator:
    Describe on the group, beside Read on the page's topic."""
    if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return denial(error, "Describe", _CLIENT_GROUP)
    return denial(error, "Read", page.topic)

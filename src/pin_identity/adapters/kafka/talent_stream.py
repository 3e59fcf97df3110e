"""The continuous consumer's Kafka side: the `pin-identity-talent-sync` group on Talent's two topics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from pin_identity.adapters.kafka.consumers import new_consumer
from pin_identity.adapters.kafka.denials import DenialLog, denial
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.adapters.talent_wire import topic_item
from pin_identity.domain.talent import TENANTS_TOPIC, USERS_TOPIC, ImportStage
from pin_identity.observability.logging import get_logger
from pin_identity.operations.ports.talent_sources import TalentRecord

log = get_logger("talent-stream")

# CONTRACTS section 5; PIN_IDENTITY_TALENT_SYNC_GROUP overrides it (staging clusters, tests).
TALENT_SYNC_GROUP = "pin-identity-talent-sync"

# Offsets are committed by hand after the database commit; a new group starts from the beginning, so a first
# start (or a reset group) reads every compacted snapshot.
_CONSUMER_DEFAULTS = {
    "group.id": TALENT_SYNC_GROUP,
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    # The classic group protocol, chosen on purpose: its session timeout is the client's to set, so a killed
    # member's partitions move within 10 s on any cluster. KIP-848's `consumer` protocol (librdkafka 2.12+,
    # Kafka 4.x) takes the session timeout from the broker, 45 s by default and at least that, and lets no
    # client set it lower.
    "group.protocol": "classic",
    "session.timeout.ms": 10_000,
    "heartbeat.interval.ms": 2_000,
    # A subscribed topic the principal may not read (or that does not exist yet) is looked for again at each
    # metadata refresh: every 15 s rather than librdkafka's 5 min, so the consumer takes it up within
    # seconds of the ACL being granted.
    "topic.metadata.refresh.interval.ms": 15_000,
    # Where a partition ends is said by its end-of-partition signal: past the last record may lie what no
    # consumer reads (a transactional producer's commit marker, records compaction removed).
    "enable.partition.eof": True,
}


# The consumer that reads a partition's first unapplied record for its timestamp: no group of its own
# (`group.id` only because librdkafka asks for one; nothing is ever committed), an end said as an end.
_PEEKER_DEFAULTS = {
    "group.id": "pin-identity-talent-sync-lag",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "fetch.wait.max.ms": 100,
}
_PEEK_TIMEOUT_S = 3.0


def _first_timestamps(peeker: Consumer, partitions: int) -> dict[tuple[str, int], datetime]:
    """Per assigned partition, the timestamp of the first record read; a partition at its end (only markers
    past the committed offset) or whose record says no time is left out."""
    found: dict[tuple[str, int], datetime] = {}
    done: set[tuple[str, int]] = set()
    deadline = SYSTEM_CLOCK.monotonic() + _PEEK_TIMEOUT_S
    while len(done) < partitions and (left := deadline - SYSTEM_CLOCK.monotonic()) > 0:
        for message in peeker.consume(partitions, min(left, 0.5)):
            where = (message.topic() or "", message.partition() or 0)
            error = message.error()
            if where in done or (error is not None and error.code() != KafkaError._PARTITION_EOF):
                continue
            kind, milliseconds = message.timestamp()
            if error is None and kind != TIMESTAMP_NOT_AVAILABLE:
                found[where] = datetime.fromtimestamp(milliseconds / 1000, UTC)
            done.add(where)
    return found


def _record(message: Message, stage: ImportStage) -> TalentRecord:
    return TalentRecord(
        topic=message.topic() or "",
        partition=message.partition() or 0,
        offset=message.offset() or 0,
        item=topic_item(stage, message.key(), message.value()),
    )


def _edges(records: Sequence[TalentRecord], *, last: bool) -> list[TopicPartition]:
    """Per partition, the offset after the last record (to commit) or of the first one (to seek back to)."""
    edges: dict[tuple[str, int], int] = {}
    for record in records:
        where = (record.topic, record.partition)
        offset = record.offset + 1 if last else record.offset
        known = edges.get(where, offset)
        edges[where] = max(known, offset) if last else min(known, offset)
    return [TopicPartition(topic, partition, offset) for (topic, partition), offset in edges.items()]


class KafkaTalentStream:
    def __init__(
        self,
        client_config: dict[str, str],
        *,
        tenants_topic: str = TENANTS_TOPIC,
        users_topic: str = USERS_TOPIC,
        overrides: dict[str, Any] | None = None,
    ):
        self._consumer = new_consumer(client_config, overrides, defaults=_CONSUMER_DEFAULTS)
        self._stages = {tenants_topic: ImportStage.TENANTS, users_topic: ImportStage.USERS}
        self._topics = list(self._stages)
        self._consumer.subscribe(self._topics)
        self._group = str((overrides or {}).get("group.id", _CONSUMER_DEFAULTS["group.id"]))
        self._denials = DenialLog("talent-sync")
        # Per partition, the offset after the last record applied to the replica: what its commit said.
        self._applied: dict[tuple[str, int], int] = {}
        # Per partition read to its end since the last commit: where the end was. Every record below it was
        # delivered, so once those are applied the end is committed (else a partition ending in a commit
        # marker would show a lag of 1 for good, and `--once` would never end).
        self._read_to: dict[tuple[str, int], int] = {}
        # Per partition, the offset the last lag() counted from (the group's committed one, else the start).
        self._counted_from: dict[tuple[str, int], int] = {}
        self._client_config = client_config
        self._peeker: Consumer | None = None  # reads the first unapplied records, outside the group

    def poll(self, max_records: int, timeout_s: float) -> list[TalentRecord]:
        records = []
        for message in self._consumer.consume(max_records, timeout_s):
            error = message.error()
            if error is None:
                records.append(_record(message, self._stages[message.topic() or ""]))
            elif error.fatal():
                raise KafkaException(error)
            elif error.code() == KafkaError._PARTITION_EOF:
                self._read_to[(message.topic() or "", message.partition() or 0)] = message.offset() or 0
            else:
                log.warning("talent-stream-error", error=error.str())
                self._say_denied(error)
        return records

    def _say_denied(self, error: KafkaError) -> None:
        """Reading its topics and committing in its group are what talent-sync's principal needs."""
        names = [self._group] if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED else self._topics
        self._denials.say(denial(error, "Read", names))

    def commit(self, records: Sequence[TalentRecord]) -> None:
        edges = {(edge.topic, edge.partition): edge.offset for edge in _edges(records, last=True)}
        for where, end in self._read_to.items():
            if end > edges.get(where, self._applied.get(where, -1)):
                edges[where] = end
        self._read_to.clear()
        if not edges:
            return
        self._applied.update(edges)
        offsets = [TopicPartition(topic, partition, offset) for (topic, partition), offset in edges.items()]
        self._consumer.commit(offsets=offsets, asynchronous=False)

    def recommit(self) -> int | None:
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        # Only this member's partitions: another member may own the rest and have committed further.
        owed = [TopicPartition(*where, at) for where, at in self._applied.items() if where in assigned]
        if not owed:
            return None
        committed = {(tp.topic, tp.partition): tp.offset for tp in self._consumer.committed(owed, timeout=5)}
        behind = [tp for tp in owed if committed.get((tp.topic, tp.partition), -1) < tp.offset]
        if behind:
            self._consumer.commit(offsets=behind, asynchronous=False)
        return len(behind)

    def rewind(self, records: Sequence[TalentRecord]) -> None:
        for partition in _edges(records, last=False):
            self._read_to.pop((partition.topic, partition.partition), None)  # read again: its end too
            try:
                self._consumer.seek(partition)
            except KafkaException as exc:  # no longer ours: the new owner starts from the committed offset
                log.info("talent-stream-seek-skipped", error=str(exc))

    def lag(self) -> dict[tuple[str, int], int] | None:
        """Per assigned partition, its end less the group's committed offset: what is applied and committed,
        not what is fetched (the console reads the same committed offsets, group_lag.py). None while the
        cluster does not say."""
        try:
            return self._lag()
        except KafkaException as exc:
            # The group's coordinator is away (its node lost, the coordinator moving): the lag is unknown for
            # a while, which is no reason to stop consuming what the partitions' leaders still serve.
            log.warning("talent-stream-lag-unavailable", error=str(exc))
            return None

    def _lag(self) -> dict[tuple[str, int], int] | None:
        assignment = self._consumer.assignment()
        if not assignment:
            # Nothing to wait for when Talent's topics do not exist (yet) in this cluster.
            return None if self._topics_exist() else {}
        committed = self._consumer.committed(assignment, timeout=5)
        lag, counted_from = {}, {}
        for stored in committed:
            # Watermarks as the last fetch response reported them: no broker call per partition.
            low, high = self._consumer.get_watermark_offsets(stored, cached=True)
            if high < 0:
                return None  # not fetched yet
            where = (stored.topic, stored.partition)
            counted_from[where] = stored.offset if stored.offset >= 0 else low
            lag[where] = max(high - counted_from[where], 0)
        self._counted_from = counted_from
        return lag

    def unapplied_since(self, behind: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], datetime]:
        """Reads the first record past the committed offset of each partition behind, with a consumer of its
        own outside the group (the group's position and prefetched records stay as they are). Asked every
        few seconds, and only of partitions with records left: a caught-up consumer reads nothing for it."""
        starts = [
            TopicPartition(topic, partition, self._counted_from[(topic, partition)])
            for (topic, partition), left in behind.items()
            if left > 0 and (topic, partition) in self._counted_from
        ]
        if not starts:
            return {}
        peeker = self._peeker or new_consumer(self._client_config, defaults=_PEEKER_DEFAULTS)
        self._peeker = peeker
        peeker.assign(starts)
        try:
            return _first_timestamps(peeker, len(starts))
        finally:
            peeker.unassign()

    def positions(self) -> dict[tuple[str, int], tuple[int, int]]:
        known = {}
        for partition in self._consumer.position(self._consumer.assignment()):
            _, high = self._consumer.get_watermark_offsets(partition, cached=True)
            if partition.offset >= 0 and high >= 0:  # read from, and fetched from, already
                known[(partition.topic, partition.partition)] = (
                    partition.offset,
                    max(high - partition.offset, 0),
                )
        return known

    def _topics_exist(self) -> bool:
        known = self._consumer.list_topics(timeout=5).topics
        return any(topic in known for topic in self._topics)

    def close(self) -> None:
        self._consumer.close()
        if self._peeker is not None:
            self._peeker.close()

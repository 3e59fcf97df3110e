"""The access topic read whole, for the audit: every partition from its beginning to the end offsets taken
when the read begins, each record reduced to (user, fingerprint of its activeAssignments)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from pin_identity.adapters.kafka.consumers import new_consumer
from pin_identity.adapters.kafka.denials import DenialLog, denial
from pin_identity.adapters.kafka.offsets import end_reached, watermarks
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.domain.access_verdicts import UNREADABLE, LastEvent, UserKey, fingerprint
from pin_identity.domain.errors import BrokerUnavailableError
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.observability.logging import get_logger
from pin_identity.operations.ports.access_reads import KeepRecords, Progress, TopicRead

log = get_logger("access-audit")

_BATCH = 5000
_UUID_TEXT, _DASH = 36, ord("-")
# consume() waits its whole timeout unless a full batch is queued: a short wait takes what is there and asks
# again.
_WAIT_S = 0.05


@dataclass
class _Ends:
    """Each partition's end offset, as the broker gave it when the read began, and which are behind it."""

    offsets: dict[int, int]
    behind: set[int] = field(default_factory=set)
    total: int = 0

    def reached(self, partition: int) -> None:
        self.behind.discard(partition)


class KafkaAccessLog:
    """A partition is read when a record or an end of partition signal reaches its end offset (offsets.py:
    an end reported below it, by a lagging replica, is not the end; the records just before the end may be
    gone: compacted away, or a transaction's commit marker). A partition that brings nothing for `stall_s` is
    reported incomplete, never taken as read: a stalled or unreachable partition must not pass for a
    converged one."""

    def __init__(self, client_config: dict[str, str], *, topic: str = ACCESS_TOPIC, stall_s: float = 15.0):
        self._client_config = client_config
        # Only committed events are read, what a consumer sees (consumers.py pins read_committed).
        self._settings = {
            "group.id": "pin-identity-access-audit",  # never joined: partitions are assigned
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            # librdkafka prefetches up to 64 MB by default; the audit keeps nothing, so 8 MB keeps the
            # fetcher ahead without holding a topic's worth of records.
            "queued.max.messages.kbytes": 8192,
            # When that queue is full, librdkafka waits this long (1 s by default) before it fetches again:
            # the audit drains it in milliseconds, and then sat idle for the rest of the second.
            "fetch.queue.backoff.ms": 10,
        }
        self._topic, self._stall_s = topic, stall_s

    def read(self, keep: KeepRecords, progress: Progress) -> TopicRead:
        consumer = new_consumer(self._client_config, self._settings)
        try:
            ends = self._assign(consumer)
            read = self._read(consumer, ends, keep, progress)
        finally:
            consumer.close()
        if ends.behind:
            log.warning("access-audit-read-short", partitions=sorted(ends.behind), records=read)
        return TopicRead(read, sorted(ends.behind))

    def _assign(self, consumer: Consumer) -> _Ends:
        metadata = consumer.list_topics(self._topic, timeout=10)
        topic = metadata.topics.get(self._topic)
        # A topic this principal may not read is no empty topic: an audit of nothing would pass.
        refused = DenialLog("access-audit").say(denial(topic.error if topic else None, "Read", self._topic))
        if refused is not None:
            raise BrokerUnavailableError(str(refused))
        if topic is None or topic.error is not None:
            return _Ends({})
        ends = _Ends({})
        for partition in topic.partitions:
            low, high = watermarks(consumer, TopicPartition(self._topic, partition))
            ends.offsets[partition] = high
            if high > low:
                ends.behind.add(partition)
                ends.total += high - low
        consumer.assign([TopicPartition(self._topic, p, OFFSET_BEGINNING) for p in sorted(ends.behind)])
        return ends

    def _read(self, consumer: Consumer, ends: _Ends, keep: KeepRecords, progress: Progress) -> int:
        read, heard = 0, SYSTEM_CLOCK.monotonic()
        while ends.behind and SYSTEM_CLOCK.monotonic() - heard < self._stall_s:
            records: list[LastEvent] = []
            for message in consumer.consume(_BATCH, _WAIT_S):
                heard = SYSTEM_CLOCK.monotonic()
                self._take(consumer, message, ends, records)
            if records:
                keep(records)
                read += len(records)
                progress(read, max(ends.total, read))
        return read

    def _take(self, consumer: Consumer, message: Message, ends: _Ends, records: list[LastEvent]) -> None:
        partition = message.partition() or 0
        if partition not in ends.behind:
            return  # past its end: the next audit's business
        end = ends.offsets[partition]
        if message.error() is None and (message.offset() or 0) < end:
            record = _last_event(message)
            if record is not None:
                records.append(record)
        if end_reached(message, end):
            self._done(consumer, partition, ends)

    def _done(self, consumer: Consumer, partition: int, ends: _Ends) -> None:
        ends.reached(partition)
        consumer.pause([TopicPartition(self._topic, partition)])


def _last_event(message: Message) -> LastEvent | None:
    user = _user_key(message.key())
    if user is None:
        return None  # not a user's event
    value = message.value()
    if value is None:
        return user, None  # a tombstone: compaction will forget the user's events
    try:
        return user, fingerprint(orjson.loads(value)["payload"]["activeAssignments"])
    except (ValueError, KeyError, TypeError):  # orjson.JSONDecodeError is a ValueError
        return user, UNREADABLE


def _user_key(key: str | bytes | None) -> UserKey | None:
    """The user's 16 bytes from a key in the relay's form (a uuid's canonical text) with no UUID object made
    (a million of them were a twentieth of the audit); any other form is read by uuid's own parse."""
    if isinstance(key, bytes) and len(key) == _UUID_TEXT and key[8] == key[13] == key[18] == key[23] == _DASH:
        try:
            packed = bytes.fromhex(key.replace(b"-", b"").decode("ascii"))
        except ValueError:  # UnicodeDecodeError is one
            packed = b""
        if len(packed) == 16:  # fromhex skips whitespace, and other dashes went with the four
            return packed
    try:
        return uuid.UUID(key.decode() if isinstance(key, bytes) else str(key)).bytes
    except ValueError:
        return None

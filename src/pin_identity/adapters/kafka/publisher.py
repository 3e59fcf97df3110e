"""Publishing outbox rows with a transactional producer (acks=all), one report per batch.

The relay's producer writes in Kafka transactions under the outbox's one `transactional.id`. A relay that
takes over initialises transactions under the same id, which aborts whatever the relay before it left open and
fences its producer at the broker: a relay that lost its lock while its producer still held events (frozen,
cut off) can land nothing behind the new one's events. Consumers therefore read with
`isolation.level=read_committed` (librdkafka's default; not the Java client's). An event counts as
acknowledged only once its transaction committed; a transaction that fails is aborted and all of it is sent
again.

A topic the relay publishes to that the broker does not have (deleted by mistake, a cluster migration) holds
its events: they are handed back to be tried again, never dead-lettered, until the topic exists again,
recreated by the relay where it may.
"""

from __future__ import annotations

import functools
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin._metadata import TopicMetadata

from pin_identity.adapters.kafka.client_log import with_client_log
from pin_identity.adapters.kafka.denials import DenialLog, denial
from pin_identity.adapters.kafka.partitioning import (
    UnsupportedPartitionerError,
    key_partition,
    partitioner_of,
)
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.config import RELAY_COORDINATOR_CALL_S
from pin_identity.domain.clock import Clock
from pin_identity.domain.events import CONTRACT_VERSION
from pin_identity.observability import metrics
from pin_identity.observability.logging import get_logger
from pin_identity.operations.ports.outbox import (
    TOPIC_MISSING,
    PendingEvent,
    Place,
    ProducerFencedError,
    PublishReport,
)

log = get_logger("kafka-publisher")
P = ParamSpec("P")
R = TypeVar("R")

# Errors that no retry can fix: the row goes to the dead letters instead of blocking the rows behind it.
_PERMANENT = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.POLICY_VIOLATION,
    KafkaError._INVALID_ARG,
}
_UNKNOWN_TOPIC = {"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC"}
# What may mean that a topic is gone: unknown, its partitions gone, or a delivery that timed out (librdkafka
# keeps sending to a deleted topic's partitions until the delivery timeout). For a topic of the relay's own,
# the broker is then asked whether the topic exists.
_TOPIC_IN_DOUBT = {*_UNKNOWN_TOPIC, "_UNKNOWN_PARTITION", "UNKNOWN_TOPIC_ID", "_MSG_TIMED_OUT"}
# Failures that say nothing of the partition an event went to: the client's own, and a purge.
_NOT_THE_PARTITIONS = {
    "_PURGE_QUEUE",
    "_PURGE_INFLIGHT",
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_FENCED",
    "_STATE",
}
# A producer of the same transactional.id initialised after this one's.
_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
# The reason given to the events of an aborted transaction that did not fail themselves.
_ABORTED = "aborted with its transaction"
# A transaction unanswered this long has the broker asked whether its partitions can take a write: a
# partition with too few replicas in sync is otherwise retried until librdkafka's delivery timeout (60 s),
# and every event of the transaction, of every partition and topic, waits as long.
STALL_AFTER_S = 3.0
# A metadata request about one topic: a broker that answers does so in milliseconds.
_METADATA_TIMEOUT_S = 2.0
# Whether a partition takes writes is asked of the broker at most this often per topic.
_METADATA_FRESH_S = 0.5
# The reason an event is handed back with when its partition cannot take a write (PublishReport.failing).
_NOT_WRITABLE = "NOT_ENOUGH_REPLICAS"
_CONTRACT_VERSION_HEADER = ("contract-version", str(CONTRACT_VERSION))


def producer_config(client_config: dict[str, str]) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "queue.buffering.max.messages": 200_000,
        "message.timeout.ms": 60_000,
        "compression.type": "lz4",
        # A new idempotent producer sends nothing before it has a producer id, which it asks for over a
        # broker connection. With sparse connections it opens one only for its first message's partition,
        # and its id request waits on librdkafka's retry timer (500 ms) meanwhile, holding up the first events
        # (librdkafka 2.16). Connected to every broker at once, it has its id at once. The relay writes to
        # every partition, so it would connect to every partition's leader all the same.
        "enable.sparse.connections": False,
        # A producer's metadata request for a missing topic must not create it (librdkafka's producer default,
        # unlike its consumer's): a topic made that way is the broker's default layout, not compacted. The
        # relay ensures the topic itself on UNKNOWN_TOPIC_OR_PART.
        "allow.auto.create.topics": False,
    }
    return with_client_log({**defaults, **client_config})


# A transaction is due as soon as the relay waits for answers (it has nothing more to hand over: a lone
# revocation goes at once), else once it holds this many events or is this old; it takes no more events then,
# and is committed once all of it is answered. Each commit costs round trips to the coordinator and a marker
# in every partition it wrote, during which nothing new is produced: under a flood, thousands of events share
# one.
TRANSACTION_EVENTS = 10_000
TRANSACTION_AGE_S = 0.5
# All three ask the transaction coordinator: a healthy one answers in milliseconds (the first time after a
# broker starts, or while it completes the transaction before, in about a second), and the relay proves its
# session between attempts (well within its session's silence limit). Never less than a second for a commit or
# an abort: librdkafka 2.16 aborts the process when a commit whose first phase (a hand-over to its own main
# thread) timed out is followed by the coordinator's answer before the next call, and it reports that timeout
# as resumable all the same (docs/librdkafka-txn-abort.md). A first phase given seconds times out only if that
# thread stalls as long, so a commit that times out is resumed, with the same timeout, past its first phase.
_INIT_TIMEOUT_S = _COMMIT_TIMEOUT_S = _ABORT_TIMEOUT_S = RELAY_COORDINATOR_CALL_S


@dataclass(frozen=True)
class WriteLimits:
    """What the relay's topics take, as their configs say: the largest event (the smallest
    `max.message.bytes`; None when the broker did not say, and librdkafka's own 1,000,000 holds) and, per
    topic, the replicas a write needs in sync (`min.insync.replicas`)."""

    message_bytes: int | None = None
    min_insync: Mapping[str, int] = field(default_factory=dict)


def unwritable_partitions(topic: TopicMetadata, min_insync: int, numbers: Iterable[int]) -> dict[int, str]:
    """Of these partitions of a topic (its metadata, as the broker just gave it), those that cannot take an
    acks=all write: no leader, or fewer replicas in sync than `min_insync` (NOT_ENOUGH_REPLICAS, which
    librdkafka only retries until the delivery times out); with why."""
    found: dict[int, str] = {}
    for number in numbers:
        partition = topic.partitions.get(number)
        if partition is None:
            continue
        if partition.leader < 0:
            found[number] = "no leader (LEADER_NOT_AVAILABLE)"
        elif len(partition.isrs) < min_insync:
            found[number] = (
                f"{len(partition.isrs)} replicas in sync, {min_insync} needed (NOT_ENOUGH_REPLICAS)"
            )
    return found


@dataclass(slots=True)
class _Transaction:
    started: float
    ids: list[int] = field(default_factory=list)  # produced in it: acknowledged only once it commits
    topics: Counter[str] = field(default_factory=Counter)
    alone: bool = False  # a suspect's own: one event, nothing else
    committing: bool = False  # due: takes no more events; committed once all of it is answered
    commit_called: bool = False  # commit_transaction() called: only it may be called until it returns
    asked_at: float = 0.0  # when the broker was last asked whether its partitions take writes


class _MissingTopics:
    """The relay's own topics (`own`) the broker said it does not have. An event of one is held: handed back
    at once to be tried again, never dead-lettered, until the topic exists again. The relay recreates it
    where it may (`create`; None where topics are created by someone else, an admin job). What changed is
    handed over with the next report."""

    def __init__(self, own: Collection[str], create: Callable[[], Collection[str]] | None):
        self.own = frozenset(own)
        self.held: dict[str, str] = {}  # topic -> why the relay did not recreate it
        self._create = create
        self._news = PublishReport()

    def examine(self, producer: Producer, topics: Iterable[str], *, asked: bool = False) -> None:
        """Ask the broker whether each topic exists; stop at the first it says nothing about (an outage is
        no missing topic). `asked`: the caller holds these topics, and hears that one exists though this
        did not hold it."""
        for topic in topics:
            exists = _topic_exists(producer, topic)
            if exists is None:
                return
            if exists:
                self._found(topic, asked=asked)
            else:
                self._recreate(producer, topic, asked=asked)

    def _recreate(self, producer: Producer, topic: str, *, asked: bool = False) -> None:
        if self._create is None:
            self._hold(topic, "the relay does not create topics")
            return
        try:
            created = self._create()
        except KafkaException as exc:  # refused (authorization, a policy) or failed: the relay holds
            error = exc.args[0]
            self._hold(topic, f"creation failed: {error.name()}: {error.str()}")
            return
        # The producer learns of it now. Should the broker not list it yet, the next event sent to it fails
        # at once and the topic is asked about again.
        _topic_exists(producer, topic)
        if topic not in created:  # someone else created it meanwhile
            self._found(topic, asked=asked)
            return
        self.held.pop(topic, None)
        self._news.topics_recreated.append(topic)

    def _hold(self, topic: str, reason: str) -> None:
        if self.held.get(topic) != reason:  # said once, and again only when the reason changes
            self.held[topic] = reason
            self._news.topics_missing[topic] = reason

    def _found(self, topic: str, *, asked: bool = False) -> None:
        if self.held.pop(topic, None) is not None or asked:
            self._news.topics_found.append(topic)

    def forget(self) -> None:
        """The relay forgot what it held (its producer discarded): what is still missing is found again. A
        topic recreated meanwhile is still told (the failure that discarded the producer may have come
        right after the recreation)."""
        self.held.clear()
        self._news = PublishReport(topics_recreated=self._news.topics_recreated)

    def hand_over(self, report: PublishReport) -> PublishReport:
        """`report` with what changed since the last one."""
        news = self._news
        if news.topics_missing or news.topics_recreated or news.topics_found:
            self._news = PublishReport()
            report.topics_missing.update(news.topics_missing)
            report.topics_recreated.extend(news.topics_recreated)
            report.topics_found.extend(news.topics_found)
        return report


def _topic_exists(producer: Producer, topic: str) -> bool | None:
    """Whether the broker has the topic, asked with the producer's own metadata request: that also renews
    what the producer knows of it (librdkafka remembers an unknown topic until its next refresh, and fails
    what is sent to it meanwhile). None when the broker did not say."""
    try:
        found = producer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
    except KafkaException:
        return None
    if found is None:
        return None
    if found.error is None or found.error.code() == KafkaError.LEADER_NOT_AVAILABLE:  # (just created)
        return True
    return False if found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART else None


def _fences_named(call: Callable[P, R]) -> Callable[P, R]:
    """The relay hears a fence (whichever call of librdkafka's meets it) as ProducerFencedError."""

    @functools.wraps(call)
    def named(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return call(*args, **kwargs)
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() in _FENCED:
                raise ProducerFencedError(f"{error.name()}: {error.str()}") from exc
            raise

    return named


class KafkaEventPublisher:
    """Keeps one producer, which writes every event in a transaction under `transactional_id` (the relay's).
    A fatal error (fenced: another relay took over) is raised to the relay, which stands down; an abort the
    coordinator does not confirm in time gets the producer replaced, once nothing is in flight, so it cannot
    reorder events.

    `own_topics` are the topics the relay publishes to: one the broker does not have holds its events while
    `ensure_topics` (None: the relay may not create topics) cannot recreate it. An event of any other topic
    the broker does not know is tried once more, then dead-lettered. `replication_shortfall` asks the broker
    whether too few replicas in sync are why nothing is taken.

    One partition never holds the others. Every event goes to the partition computed for its key (the
    configured partitioner, the topic's partition count), so what fails is known by partition: a delivery
    that fails names its partition in the report's `failing`, and a transaction still unanswered after
    `stall_after_s` asks the broker (`unwritable`) whether any of its partitions cannot take a write (no
    leader, too few replicas in sync): if so it is aborted at once, rather than after librdkafka's delivery
    timeout, and those partitions are named, so that their events stay out of the next transaction.

    One event never takes others with it. The largest event the producer takes is the smallest limit of the
    relay's topics (`message_limit`): a larger one fails alone, before it is sent. Should the broker refuse a
    request all the same (its limit lowered meanwhile, a policy), it refuses every event of it: those become
    suspects, each sent again in a transaction of its own, and only one refused alone is rejected for good.
    """

    def __init__(
        self,
        client_config: dict[str, str],
        ensure_topics: Callable[[], Collection[str]] | None,
        *,
        transactional_id: str,
        own_topics: Collection[str] = (),
        replication_shortfall: Callable[[], str | None] | None = None,
        write_limits: Callable[[], WriteLimits] | None = None,
        queue_kbytes: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self._config = {**producer_config(client_config), "transactional.id": transactional_id}
        if queue_kbytes is not None:
            self._config["queue.buffering.max.kbytes"] = queue_kbytes
        self._replication_shortfall = replication_shortfall
        self._write_limits = write_limits
        self._limits = WriteLimits()  # read again with each producer
        self._partitioner = _partitioner(self._config)
        self._partition_counts: dict[str, int] = {}
        self._metadata: dict[str, tuple[float, TopicMetadata]] = {}  # topic -> (when asked, what was said)
        self._denials = DenialLog("outbox-relay", clock)
        self._clock = clock
        self._transaction: _Transaction | None = None
        self._waiting: list[PendingEvent] = []  # handed over while a transaction commits: the next one's
        self._suspects: set[int] = set()  # refused with others: each goes again in a transaction of its own
        self._alone: deque[PendingEvent] = deque()  # suspects handed over, each waiting for its transaction
        self._fatal: KafkaError | None = None
        self._missing = _MissingTopics(own_topics, ensure_topics)
        self._producer: Producer | None = None
        self._replace = False
        self._answers = PublishReport()
        self._unknown_topic_retried: set[str] = set()
        self._topic_of_retry: dict[int, str] = {}
        self._published: Counter[str] = Counter()  # per topic, added to the metric once per collect()
        self._generation = 0  # bumped when the producer is discarded; its late reports are ignored
        # The events in flight by topic and key: one callback serves them all, where a callback made per
        # event would leave tens of thousands of objects for the garbage collector to walk (full collections
        # took a third of the relay's time). A second event of a key in flight gets a callback of its own.
        # An event written is acknowledged only once its transaction commits (its delivery report comes
        # before the commit).
        self._in_flight: dict[str, dict[bytes, int]] = {}
        self._one_offs = 0  # events in flight with a callback of their own
        self._on_delivery = self._delivery_handler(self._generation)

    def _error_handler(self, generation: int) -> Callable[[KafkaError], None]:
        def on_error(error: KafkaError) -> None:
            log.warning("kafka-client-error", code=error.name(), fatal=error.fatal())
            if error.fatal() and generation == self._generation:  # not a replaced producer's last words
                self._fatal = error

        return on_error

    def _current(self) -> Producer:
        if self._fatal is not None:
            raise KafkaException(self._fatal)  # fenced: another relay's producer is the one now
        if self._producer is not None and self._replace and not self._outstanding():
            log.warning("kafka-producer-replaced")
            self._producer.purge()
            self._producer.flush(0)
            self._producer = None
            self._forget_in_flight()
        if self._producer is None:
            config = {**self._config, "error_cb": self._error_handler(self._generation)}
            self._limits = self._write_limits() if self._write_limits is not None else WriteLimits()
            if self._limits.message_bytes is not None:  # never above what the topics take (a larger event
                # fails here, alone), nor above what the operator set
                configured = int(config.get("message.max.bytes", self._limits.message_bytes))
                config["message.max.bytes"] = min(configured, self._limits.message_bytes)
            producer = Producer(config)
            try:
                producer.init_transactions(_INIT_TIMEOUT_S)  # aborts and fences what the last relay left
            except KafkaException as exc:
                self._denials.say(denial(exc, "Write", self._config["transactional.id"]))
                raise
            self._producer = producer
            self._partition_counts.clear()  # a new producer, perhaps on topics recreated since
            self._metadata.clear()
            self._on_delivery = self._delivery_handler(self._generation)
            self._replace = False
        return self._producer

    def _outstanding(self) -> bool:
        return self._transaction is not None or bool(self._waiting) or bool(self._alone) or self._unanswered()

    def _unanswered(self) -> bool:
        """Events handed to the producer whose delivery report has not been served yet."""
        return self._one_offs > 0 or any(self._in_flight.values())

    def _delivery_handler(self, generation: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(error: KafkaError | None, msg: Message) -> None:
            if generation != self._generation:
                return  # a discarded producer's purge: its rows stay in the outbox
            topic = msg.topic() or ""
            outbox_id = self._in_flight[topic].pop(msg.key())  # type: ignore[arg-type]
            if error is not None:  # written: acknowledged once its transaction commits
                self._classify(outbox_id, (topic, msg.partition()), error, self._answers)

        return on_delivery

    def _one_off_handler(self, outbox_id: int, topic: str) -> Callable[[KafkaError | None, Message], None]:
        generation = self._generation

        def on_delivery(error: KafkaError | None, msg: Message) -> None:
            if generation != self._generation:
                return
            self._one_offs -= 1
            if error is not None:
                self._classify(outbox_id, (topic, msg.partition()), error, self._answers)

        return on_delivery

    @_fences_named
    def start(self) -> None:
        self._current()

    def partition(self, topic: str, key: str) -> int | None:
        count = self._partition_counts.get(topic) or self._count_partitions(topic)
        if count is None or self._partitioner is None or not key:
            return None
        return key_partition(key.encode(), count, self._partitioner)

    def _count_partitions(self, topic: str) -> int | None:
        """From the producer's own metadata (the broker asked at most once per topic and producer)."""
        if self._producer is None:
            return None
        try:
            found = self._producer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
        except KafkaException:
            return None
        if found is None or found.error is not None or not found.partitions:
            return None
        self._partition_counts[topic] = len(found.partitions)
        return len(found.partitions)

    @_fences_named
    def look_for(self, topics: Collection[str]) -> PublishReport:
        self._missing.examine(self._current(), sorted(topics), asked=True)
        return self._missing.hand_over(PublishReport())

    @_fences_named
    def send(self, events: Sequence[PendingEvent]) -> PublishReport:
        producer = self._current()
        if self._missing.held:  # the held events are tried again: is their topic back?
            self._missing.examine(producer, {event.topic for event in events} & self._missing.held.keys())
        self._alone.extend(event for event in events if event.outbox_id in self._suspects)
        events = [event for event in events if event.outbox_id not in self._suspects]
        report = PublishReport()
        if self._transaction is None and self._alone:
            self._send_alone(producer, report)
        if self._transaction is not None and self._transaction.committing:
            self._waiting.extend(events)
        elif events:
            _merge(report, self._produce_all(producer, events))
        self._examine_failures(producer, report)
        return self._missing.hand_over(report)

    def _produce_all(
        self, producer: Producer, events: Sequence[PendingEvent], *, alone: bool = False
    ) -> PublishReport:
        failed_at_once = PublishReport()
        transaction = self._transaction
        if transaction is None:
            producer.begin_transaction()
            transaction = self._transaction = _Transaction(self._clock.monotonic(), alone=alone)
            # A suspect's transaction takes nothing else: it is committed as soon as it is answered.
            transaction.committing = alone
        held = self._missing.held
        placed, short = self._placed(events)
        for event, partition in placed:
            place = (event.topic, partition)
            if held and event.topic in held:
                failed_at_once.retry[event.outbox_id] = TOPIC_MISSING
            elif place in short:
                failed_at_once.retry[event.outbox_id] = _NOT_WRITABLE
                failed_at_once.failing[(event.topic, partition)] = short[place]  # type: ignore[index]
            else:
                self._produce(producer, event, partition, failed_at_once)
        failed = failed_at_once.retry.keys() | failed_at_once.rejected.keys()
        for event in events:
            if event.outbox_id not in failed:
                transaction.ids.append(event.outbox_id)
                transaction.topics[event.topic] += 1
        return failed_at_once

    def _placed(
        self, events: Sequence[PendingEvent]
    ) -> tuple[list[tuple[PendingEvent, int | None]], dict[Place, str]]:
        """Each event with its partition, and the partitions the broker says cannot take a write now. Kafka
        ends a transaction by writing a marker in each of its partitions, acks=all: one that took a partition
        short of replicas can neither commit nor abort until the partition is back, and its transactional.id
        (the relay's one) takes nothing else meanwhile. So no event goes to such a partition. The partition is
        computed only for the events of a topic that has one (None: librdkafka places the event, in the same
        partition): most of the time no topic has, and the relay's hot path computes nothing."""
        short = self._unwritable_in({event.topic for event in events})
        computed = {topic for topic, _ in short}
        placed = [
            (event, self.partition(event.topic, event.key) if event.topic in computed else None)
            for event in events
        ]
        return placed, short

    def _send_alone(self, producer: Producer, report: PublishReport) -> None:
        """With no transaction open, a suspect goes in one of its own."""
        while self._alone and self._transaction is None:
            _merge(report, self._produce_all(producer, [self._alone.popleft()], alone=True))
            if self._transaction is not None and not self._transaction.ids:
                self._transaction = None  # it failed at once (refused alone): nothing to commit
                producer.abort_transaction(_ABORT_TIMEOUT_S)

    def _next_transaction(self, producer: Producer, report: PublishReport) -> None:
        """After a transaction ended: a suspect's own first, else what waited for it."""
        self._send_alone(producer, report)
        if self._transaction is not None:
            return
        waiting, self._waiting = self._waiting, []
        if waiting:
            failed_at_once = self._produce_all(producer, waiting)
            self._examine_failures(producer, failed_at_once)
            _merge(report, failed_at_once)

    @_fences_named
    def collect(self, timeout_s: float) -> PublishReport:
        # Answers are waited for with poll(), which any answer wakes: a transaction is committed only once
        # all of it is answered (_settle_transaction), never by stepping a commit through the wait.
        if self._producer is not None and self._outstanding():
            self._producer.poll(timeout_s if self._unanswered() else 0)
            self._producer.poll(0)  # serve every answer already queued, not just the first
        elif timeout_s:
            time.sleep(timeout_s)
        answers, self._answers = self._answers, PublishReport()
        if self._producer is not None:  # before an abort: one whose topic was deleted fails for good
            self._examine_failures(self._producer, answers)
        if self._transaction is not None and self._producer is not None:
            self._settle_transaction(self._producer, answers, wait_s=timeout_s)
        if self._transaction is None and self._producer is not None:
            self._next_transaction(self._producer, answers)
        self._count_published()
        return self._missing.hand_over(answers)

    def _count_published(self) -> None:
        for topic, count in self._published.items():
            metrics.outbox_published_total.labels(topic=topic).inc(count)
        # A topic that delivered exists: should it vanish later, its events get their one more try again.
        self._unknown_topic_retried.difference_update(self._published)
        self._published.clear()

    def _settle_transaction(self, producer: Producer, answers: PublishReport, *, wait_s: float) -> None:
        """Abort the open transaction if any of it failed (or it waits on a partition that cannot take a
        write), else commit it once due and all of it answered."""
        transaction = self._transaction
        assert transaction is not None
        # Once commit_transaction() was called, librdkafka takes no other transactional call until it
        # returns: it fails by itself (abortable) when an event of it failed, and is aborted then.
        if not transaction.commit_called and not (answers.retry or answers.rejected) and self._stalled():
            answers.failing.update(self._unwritable_in(transaction.topics))
        if (answers.retry or answers.rejected or answers.failing) and not transaction.commit_called:
            self._abort(producer, answers)
            return
        full = len(transaction.ids) >= TRANSACTION_EVENTS
        due = wait_s > 0 or full or self._clock.monotonic() - transaction.started >= TRANSACTION_AGE_S
        transaction.committing |= due
        # Once every event of it is answered, a failure of the transaction's is known (aborted above), and the
        # commit is one round trip to the coordinator.
        if not transaction.committing or self._unanswered():
            return
        transaction.commit_called = True
        try:
            producer.commit_transaction(_COMMIT_TIMEOUT_S)
        except KafkaException as exc:
            if not exc.args[0].retriable():  # else the coordinator is away: the next collect() resumes it
                self._commit_failed(producer, answers, exc)
            return
        answers.delivered.extend(transaction.ids)
        self._suspects.difference_update(transaction.ids)
        self._published.update(transaction.topics)
        self._transaction = None
        self._next_transaction(producer, answers)

    def _stalled(self) -> bool:
        """Whether the open transaction has waited on answers past `stall_after_s` (asked again at most that
        often: it costs the broker a metadata request)."""
        transaction = self._transaction
        if transaction is None or not self._unanswered():
            return False
        now = self._clock.monotonic()
        if now - max(transaction.started, transaction.asked_at) < STALL_AFTER_S:
            return False
        transaction.asked_at = now
        return True

    def _unwritable_in(self, topics: Collection[str]) -> dict[Place, str]:
        """Every partition of these topics that cannot take a write now."""
        found: dict[Place, str] = {}
        for topic in topics:
            metadata = self._topic_metadata(topic)
            if metadata is not None:
                found.update(self.unwritable([(topic, number) for number in metadata.partitions]))
        return found

    def unwritable(self, places: Collection[Place]) -> dict[Place, str]:
        found: dict[Place, str] = {}
        for topic in {topic for topic, _ in places}:
            metadata = self._topic_metadata(topic)
            if metadata is None:  # the broker did not say: the stall check and delivery timeout decide
                continue
            numbers = [number for each, number in places if each == topic]
            needed = self._limits.min_insync.get(topic, 1)
            for number, reason in unwritable_partitions(metadata, needed, numbers).items():
                found[(topic, number)] = reason
        return found

    def _topic_metadata(self, topic: str) -> TopicMetadata | None:
        """The topic's partitions (leaders, replicas in sync) from the producer's own metadata request, asked
        at most every `_METADATA_FRESH_S` (a busy relay checks each transaction's new partitions)."""
        now = self._clock.monotonic()
        known = self._metadata.get(topic)
        if known is not None and now - known[0] < _METADATA_FRESH_S:
            return known[1]
        if self._producer is None:
            return None
        try:
            found = self._producer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
        except KafkaException as exc:
            log.warning("kafka-partitions-unknown", error=exc.args[0].name())
            return None
        if found is None or found.error is not None:
            return None
        self._metadata[topic] = (now, found)
        return found  # type: ignore[no-any-return]

    def _commit_failed(self, producer: Producer, answers: PublishReport, exc: KafkaException) -> None:
        """Abort the transaction, or raise what is fatal (fenced: a relay took over). The commit served the
        delivery reports that came while it waited: what they say (a topic gone, an event refused for good)
        counts as if collect() had heard it."""
        served, self._answers = self._answers, PublishReport()
        answers.retry.update(served.retry)
        answers.rejected.update(served.rejected)
        answers.failing.update(served.failing)
        self._examine_failures(producer, answers)
        error = exc.args[0]
        if error.code() == KafkaError._STATE:
            # librdkafka lost track of its own calls (no other relay took over): nothing is known of the
            # transaction, so all of it goes again, with a new producer that fences this one.
            log.warning("kafka-transaction-state-lost", code=error.name())
            self._drop_transaction(answers, error.name())
            self._replace = True
            self._forget_in_flight()
            return
        if not error.txn_requires_abort():
            raise exc
        self._abort(producer, answers, because=error.name())

    def _abort(self, producer: Producer, answers: PublishReport, because: str = _ABORTED) -> None:
        """Nothing of an aborted transaction is visible to a read_committed consumer: all of it (and what
        waited for it) is to be sent again, but for an event the broker refused for good. Its topics of the
        relay's own are looked for: a topic deleted under the producer fails the whole transaction (its
        coordinator refuses to add the topic's partitions), with no event's answer to name it."""
        self._suspect_the_refused(answers)
        assert self._transaction is not None
        self._missing.examine(producer, sorted(set(self._transaction.topics) & self._missing.own))
        self._drop_transaction(answers, because)
        try:
            producer.abort_transaction(_ABORT_TIMEOUT_S)  # purges what is in flight
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise
            # Not confirmed in time (the coordinator is away, or busy bumping the producer's epoch). The
            # abort is not resumed: librdkafka 2.16 can trip its own state machine (an assertion that kills
            # the process) when a timed-out abort meets an epoch bump. The producer is replaced instead; the
            # next one's init_transactions() aborts at the coordinator whatever this one left open.
            log.warning("kafka-transaction-abort-unconfirmed", code=exc.args[0].name())
            self._replace = True
        self._forget_in_flight()  # the purged events' answers are moot: all of them go again
        producer.poll(0)

    def _suspect_the_refused(self, answers: PublishReport) -> None:
        """Events the broker refused in a transaction of several: it refuses a whole request (every event of
        one partition's batch), so each is tried alone before any is rejected for good."""
        transaction = self._transaction
        if transaction is None or not answers.rejected:
            return
        if transaction.alone or len(transaction.ids) < 2:  # refused alone: for good
            self._suspects.difference_update(answers.rejected)
            return
        for outbox_id, reason in list(answers.rejected.items()):
            if outbox_id in transaction.ids:
                del answers.rejected[outbox_id]
                answers.retry[outbox_id] = reason.split(":", 1)[0]
                self._suspects.add(outbox_id)
        log.warning("outbox-events-suspected", events=len(self._suspects))

    def _drop_transaction(self, answers: PublishReport, because: str) -> None:
        """All of the open transaction (and what waited for it) to be sent again, but for an event the broker
        refused for good; each keeps the reason it failed for, the others the transaction's."""
        transaction = self._transaction
        assert transaction is not None
        for outbox_id in [*transaction.ids, *(event.outbox_id for event in self._waiting)]:
            if outbox_id not in answers.rejected:
                answers.retry.setdefault(outbox_id, because)
        self._transaction = None
        self._waiting = []

    def _forget_in_flight(self) -> None:
        """A new generation: answers about what was handed out before are ignored when they come."""
        self._generation += 1
        self._on_delivery = self._delivery_handler(self._generation)
        self._one_offs = 0
        self._answers = PublishReport()
        self._in_flight.clear()

    def _produce(
        self, producer: Producer, event: PendingEvent, partition: int | None, failed_at_once: PublishReport
    ) -> None:
        outbox_id, topic, key_text, value, event_type, correlation_id, traceparent = event
        key = key_text.encode()
        in_flight = self._in_flight.get(topic)
        if in_flight is None:
            in_flight = self._in_flight[topic] = {}
        shared = not key or key in in_flight
        on_delivery = self._one_off_handler(outbox_id, topic) if shared else self._on_delivery
        headers: list[tuple[str, str | bytes | None]] = [
            ("event-type", event_type),
            _CONTRACT_VERSION_HEADER,
            ("correlation-id", correlation_id),
        ]
        if traceparent:
            headers.append(("traceparent", traceparent))
        # -1: librdkafka's own choice (RD_KAFKA_PARTITION_UA), where no partition is known here.
        placed = -1 if partition is None else partition
        while True:
            try:
                producer.produce(
                    topic, value, key, partition=placed, headers=headers, on_delivery=on_delivery
                )
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let deliveries drain it
                continue
            except KafkaException as exc:
                self._classify(outbox_id, (topic, partition), exc.args[0], failed_at_once)
                return
            if shared:
                self._one_offs += 1
            else:
                in_flight[key] = outbox_id
            return

    def _classify(
        self, outbox_id: int, place: tuple[str, int | None], error: KafkaError, report: PublishReport
    ) -> None:
        topic, partition = place
        self._denials.say(denial(error, "Write", topic))  # retried below: held until the ACL is granted
        if error.code() in _PERMANENT:
            report.rejected[outbox_id] = f"{error.name()}: {error.str()}"
            return
        report.retry[outbox_id] = error.name()
        self._topic_of_retry[outbox_id] = topic
        if partition is not None and partition >= 0 and error.name() not in _NOT_THE_PARTITIONS:
            report.failing[(topic, partition)] = error.name()

    def _examine_failures(self, producer: Producer, report: PublishReport) -> None:
        """What failed for a reason that may mean its topic is gone. The broker is asked about a topic of the
        relay's own (held while missing); an unknown topic of any other kind is tried once more (created a
        moment ago, it may not be in every broker's metadata yet), and dead-lettered when unknown again."""
        in_doubt: set[str] = set()
        unknown: set[str] = set()
        for outbox_id, code in list(report.retry.items()):
            topic = self._topic_of_retry.pop(outbox_id, None)  # none for what an aborted transaction held
            if topic is None:
                continue
            if topic in self._missing.own:
                if code in _TOPIC_IN_DOUBT:
                    in_doubt.add(topic)
            elif code in _UNKNOWN_TOPIC:
                unknown.add(topic)
                if topic in self._unknown_topic_retried:
                    del report.retry[outbox_id]
                    report.rejected[outbox_id] = f"{code}: topic {topic} unknown when tried again"
        self._unknown_topic_retried |= unknown
        if in_doubt:
            self._missing.examine(producer, sorted(in_doubt))

    def discard(self) -> None:
        """Purge what the producer holds and close it (its connections go); its late reports are ignored."""
        producer, self._producer = self._producer, None
        self._forget_in_flight()
        if producer is not None:
            try:
                producer.purge(in_queue=True, in_flight=True)
                producer.flush(0)
            except (KafkaException, RuntimeError) as exc:
                log.warning("kafka-producer-discard-failed", error=type(exc).__name__)
            # The last reference going destroys the client right here, its connections with it. Not
            # Producer.close(): with a transaction open it waits for the abort, which an unreachable broker
            # never confirms. The next producer of this transactional.id (the next relay) aborts it anyway.
            del producer
        self._topic_of_retry.clear()
        self._replace = False
        self._transaction = None
        self._waiting = []
        self._alone.clear()  # the relay forgets what it handed over; a suspect stays one when read again
        self._missing.forget()
        self._fatal = None

    def replication_shortfall(self) -> str | None:
        return self._replication_shortfall() if self._replication_shortfall is not None else None

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)


def _merge(report: PublishReport, more: PublishReport) -> None:
    """`more`'s failures into `report` (what a send fails at once is answered with the rest)."""
    report.retry.update(more.retry)
    report.rejected.update(more.rejected)
    report.failing.update(more.failing)


def _partitioner(config: Mapping[str, Any]) -> str | None:
    """The configured partitioner, when a key's partition can be computed for it."""
    try:
        return partitioner_of(config)
    except UnsupportedPartitionerError:
        return None

"""The relay loop over in-memory fakes: what it settles, when it backs off, when it stands by.

Time is driven, never slept: the relay's clock moves only when it waits (on the stop signal, or on the broker
in `collect`), by as long as it asked to wait.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from pin_identity.adapters.postgres.outbox_queue import IdHorizon
from pin_identity.config import RelaySettings
from pin_identity.domain.errors import OutboxIdsWentBackError
from pin_identity.jobs.outbox_relay import OutboxRelay
from pin_identity.jobs.outbox_relay_observer import RelayObserver
from pin_identity.operations.ports.outbox import (
    Fetched,
    OutboxBacklog,
    PendingEvent,
    Place,
    ProducerFencedError,
    PublishReport,
    RelayRole,
)


def _event(n: int, key: str | None = None, *, topic: str = "t", size: int = 2) -> PendingEvent:
    return PendingEvent(
        n, topic, key or f"k{n}", b"{" + b" " * (size - 2) + b"}", "E", str(uuid.uuid4()), None
    )


class MemoryQueue:
    def __init__(self, rows: list[PendingEvent], *, active: bool = True, clean: bool = True):
        self.rows, self.active, self.clean = rows, active, clean
        self.dead: dict[int, str] = {}
        self.stood_down = 0
        self.took_over = False

    def try_become_active(self) -> RelayRole:
        if not self.active:
            return RelayRole.STANDBY
        if not self.took_over:
            self.took_over = True
            return RelayRole.ACTIVE if self.clean else RelayRole.TAKEN_OVER
        return RelayRole.ACTIVE

    def fetch_ready(
        self, limit: int, after: int, *, max_bytes: int, skip_topics: Collection[str] = ()
    ) -> Fetched:
        rows = [row for row in self.rows if row.outbox_id > after and row.topic not in skip_topics]
        return _fetched(rows, limit, max_bytes, after, self.final)

    def fetch_topic(self, topic: str, limit: int, after: int, upto: int, *, max_bytes: int) -> Fetched:
        rows = [row for row in self.rows if after < row.outbox_id <= upto and row.topic == topic]
        return _fetched(rows, limit, max_bytes, after, min(upto, self.final))

    @property
    def final(self) -> int:
        return max((row.outbox_id for row in self.rows), default=0)

    def settle(self, delivered: Sequence[int], rejected: Mapping[int, str]) -> None:
        gone = set(delivered) | set(rejected)
        self.rows = [row for row in self.rows if row.outbox_id not in gone]
        self.dead.update(rejected)

    def backlog(self) -> OutboxBacklog:
        return OutboxBacklog(len(self.rows), 0.0)

    def is_drained(self) -> bool:
        return not self.rows

    def heartbeat(self) -> None:
        return None

    def still_active(self) -> bool:
        return self.took_over

    def stand_down(self) -> None:
        self.stood_down += 1
        self.took_over = False


def _fetched(rows: list[PendingEvent], limit: int, max_bytes: int, after: int, end: int) -> Fetched:
    """As the outbox reads: at most `limit` rows and `max_bytes` of values (the first whatever its size)."""
    taken: list[PendingEvent] = []
    for row in rows[:limit]:
        if taken and sum(len(r.value) for r in taken) + len(row.value) > max_bytes:
            break
        taken.append(row)
    complete = len(taken) == len(rows) and len(taken) < limit
    return Fetched(taken, end if complete or not taken else taken[-1].outbox_id)


_START = datetime(2026, 12, 1, tzinfo=UTC)


class DrivenTime:
    """The relay's clock and its stop signal in one: a wait moves the clock on by its timeout at once.

    It sets itself after `stop_after_waits` waits, once the clock reaches `stop_at`, or when `set()`.
    """

    def __init__(self, *, stop_after_waits: int = 1000, stop_at: float = math.inf):
        self.now_s = 0.0
        self.waits: list[float | None] = []
        self._stop_after_waits, self._stop_at = stop_after_waits, stop_at

    def now(self) -> datetime:
        return _START + timedelta(seconds=self.now_s)

    def monotonic(self) -> float:
        return self.now_s

    def is_set(self) -> bool:
        return len(self.waits) >= self._stop_after_waits or self.now_s >= self._stop_at

    def set(self) -> None:
        self._stop_at = -math.inf

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.pass_time(timeout or 0.0)
        return self.is_set()

    def pass_time(self, seconds: float) -> None:
        self.now_s += seconds


class ScriptedPublisher:
    """Answers each outbox id from a script: 'ok', 'reject', 'retry' (then 'ok' next time), 'silent'
    (never answered), or 'held' (its topic is missing: handed back at once, twice, then the topic is found).

    Answers arrive on the next collect(), like broker acknowledgements; a collect's wait passes on `time`.
    """

    def __init__(self, script: dict[int, str], time: DrivenTime | None = None):
        self.script = script
        self._time = time
        self.sent: list[list[int]] = []
        self.discarded = 0
        self.calls: list[str] = []  # "start" and "send", in order
        self._answers = PublishReport()
        self.looks: dict[str, int] = {}

    def start(self) -> None:
        self.calls.append("start")

    def partition(self, topic: str, key: str) -> int | None:
        return None

    def unwritable(self, places: Collection[Place]) -> dict[Place, str]:
        return {}

    def look_for(self, topics: Collection[str]) -> PublishReport:
        """A held topic is found at the second look."""
        report = PublishReport()
        for topic in topics:
            self.looks[topic] = self.looks.get(topic, 0) + 1
            if self.looks[topic] >= 2:
                report.topics_found.append(topic)
                self.script = {n: v for n, v in self.script.items() if v != "held"}
        return report

    def send(self, events: Sequence[PendingEvent]) -> PublishReport:
        self.sent.append([e.outbox_id for e in events])
        self.calls.append("send")
        at_once = PublishReport()
        for event in events:
            verdict = self.script.get(event.outbox_id, "ok")
            if verdict == "held" and self._held(event, at_once):
                continue
            if verdict == "reject":
                self._answers.rejected[event.outbox_id] = "MSG_SIZE_TOO_LARGE"
            elif verdict == "retry":
                self._answers.retry[event.outbox_id] = "_MSG_TIMED_OUT"
                self.script[event.outbox_id] = "ok"
            elif verdict == "silent":
                continue
            else:
                self._answers.delivered.append(event.outbox_id)
        return at_once

    def answer_later(self, delivered: list[int]) -> None:
        """The broker acknowledges these (sent before, unanswered) with the next collect()."""
        self._answers.delivered.extend(delivered)

    def _held(self, event: PendingEvent, at_once: PublishReport) -> bool:
        """The event is handed back at once, its topic missing (until `look_for` finds it)."""
        at_once.topics_missing[event.topic] = "the relay does not create topics"
        at_once.retry[event.outbox_id] = "UNKNOWN_TOPIC_OR_PART"
        return True

    def collect(self, timeout_s: float) -> PublishReport:
        if self._time is not None:
            self._time.pass_time(timeout_s)
        answers, self._answers = self._answers, PublishReport()
        return answers

    def discard(self) -> None:
        self.discarded += 1
        self._answers = PublishReport()

    def replication_shortfall(self) -> str | None:
        return None


class BrokenQueue(MemoryQueue):
    """Its session is gone: every heartbeat fails; after `stand_downs` stand-downs it stops the relay."""

    def __init__(self, time: DrivenTime, stand_downs: int):
        super().__init__([])
        self._time, self._stand_downs = time, stand_downs

    def heartbeat(self) -> None:
        if self.stood_down >= self._stand_downs:
            self._time.set()
        raise ConnectionError("database went away")


FAST = RelaySettings(batch_size=3, max_in_flight=6, idle_wait_s=0.001, standby_wait_s=0.001, max_backoff_s=0)


def _relay(
    queue: MemoryQueue,
    publisher: ScriptedPublisher,
    time: DrivenTime,
    observer: RelayObserver | None = None,
    settings: RelaySettings = FAST,
) -> OutboxRelay:
    return OutboxRelay(queue, publisher, settings, observer, clock=time)


def test_once_drains_in_batches_dead_letters_rejects_and_retries_the_rest() -> None:
    queue = MemoryQueue([_event(n) for n in range(1, 8)])
    publisher, time = ScriptedPublisher({2: "reject", 5: "retry"}), DrivenTime()
    _relay(queue, publisher, time).run(time, once=True)
    assert queue.rows == []
    assert queue.dead == {2: "MSG_SIZE_TOO_LARGE"}
    # 5 asks for a retry: nothing new is sent until the batch in flight settled, then 5 goes first.
    assert publisher.sent == [[1, 2, 3], [4, 5, 6], [5, 7]]
    assert queue.stood_down == 1 and publisher.discarded == 1  # the lock is handed over when it stops


def test_one_event_per_key_is_in_flight_so_a_retried_event_goes_before_anything_newer_of_its_key() -> None:
    rows = [_event(1, "a"), _event(2, "a"), _event(3, "b"), _event(4, "a"), _event(5, "b")]
    queue = MemoryQueue(rows)
    publisher, time = ScriptedPublisher({1: "retry"}), DrivenTime()
    _relay(queue, publisher, time).run(time, once=True)
    assert queue.rows == []
    # 2 and 4 wait behind 1 (same key); when 1 fails it goes again, first of its key (beside 5, of the other
    # key), and only then 2, then 4.
    assert publisher.sent == [[1, 3], [1, 5], [2], [4]]


def test_a_standby_relay_publishes_nothing_and_with_once_waits_for_the_outbox_to_drain() -> None:
    queue = MemoryQueue([_event(1)], active=False)
    publisher = ScriptedPublisher({})
    time = DrivenTime(stop_after_waits=5)
    _relay(queue, publisher, time).run(time, once=True)
    assert publisher.sent == [] and publisher.calls == [] and len(queue.rows) == 1  # no producer either
    assert len(time.waits) == 5  # it stood by until stopped: another relay still had rows to publish


def test_with_once_the_relay_waits_until_the_other_jobs_of_its_process_ended() -> None:
    queue = MemoryQueue([])
    ended = iter([False, False, True])
    time = DrivenTime()
    _relay(queue, ScriptedPublisher({}), time).run(time, once=True, until=lambda: next(ended))
    assert queue.is_drained()  # and it returned after the third look, with nothing sent


def test_an_active_relay_starts_its_producer_before_its_first_read() -> None:
    reads: list[int] = []

    class RecordingQueue(MemoryQueue):
        def fetch_ready(
            self, limit: int, after: int, *, max_bytes: int, skip_topics: Collection[str] = ()
        ) -> Fetched:
            reads.append(len(publisher.calls))  # how many publisher calls came before this read
            return super().fetch_ready(limit, after, max_bytes=max_bytes, skip_topics=skip_topics)

    publisher, time = ScriptedPublisher({}), DrivenTime()
    _relay(RecordingQueue([_event(1)]), publisher, time).run(time, once=True)
    assert publisher.calls[:2] == ["start", "send"] and reads[0] == 1


def test_a_relay_taking_over_from_one_that_did_not_stand_down_says_so_and_publishes_at_once() -> None:
    queue = MemoryQueue([_event(1)], clean=False)
    publisher = ScriptedPublisher({})
    observer, time = RecordingObserver(), DrivenTime()
    _relay(queue, publisher, time, observer).run(time, once=True)
    assert (
        "took over" in observer.calls and publisher.calls[:2] == ["start", "send"] and publisher.sent == [[1]]
    )


def test_a_failing_queue_stands_down_discards_the_producer_and_retries_until_stopped() -> None:
    time = DrivenTime()
    queue = BrokenQueue(time, stand_downs=3)
    publisher = ScriptedPublisher({})
    _relay(queue, publisher, time).run(time)
    # Four failures (the fourth stops the relay), each followed by a stand-down, and the final one.
    assert queue.stood_down == 5 and publisher.discarded == 5


class ClockedQueue(MemoryQueue):
    """Notes when (by the relay's clock) the relay proved its session and looked at the backlog."""

    def __init__(self, rows: list[PendingEvent], time: DrivenTime):
        super().__init__(rows)
        self._time = time
        self.heartbeats: list[float] = []
        self.backlog_looks: list[float] = []

    def heartbeat(self) -> None:
        self.heartbeats.append(self._time.monotonic())

    def backlog(self) -> OutboxBacklog:
        self.backlog_looks.append(self._time.monotonic())
        return super().backlog()


def test_an_idle_relay_proves_its_session_and_looks_at_the_backlog_each_at_its_own_cadence() -> None:
    time = DrivenTime(stop_at=2.0)
    queue = ClockedQueue([], time)
    settings = RelaySettings(idle_wait_s=0.125, heartbeat_every_s=0.5, backlog_every_s=1.0)
    _relay(queue, ScriptedPublisher({}, time), time, settings=settings).run(time)
    assert queue.heartbeats == [0.0, 0.5, 1.0, 1.5]
    assert queue.backlog_looks == [0.0, 1.0]
    assert time.waits == [0.125] * 16  # idle: a pause after each look at an empty outbox


def test_after_a_stand_down_the_relay_proves_its_session_at_once() -> None:
    time = DrivenTime(stop_at=1.25)

    class FlakyQueue(ClockedQueue):
        def heartbeat(self) -> None:
            super().heartbeat()
            if len(self.heartbeats) == 2:
                raise ConnectionError("database went away")

    queue = FlakyQueue([], time)
    settings = RelaySettings(idle_wait_s=0.125, heartbeat_every_s=0.5, max_backoff_s=0)
    _relay(queue, ScriptedPublisher({}, time), time, settings=settings).run(time)
    # The second heartbeat fails: the relay stands down and proves its new session at once, not 0.5 s later.
    assert queue.heartbeats == [0.0, 0.5, 0.5, 1.0]


def test_on_stop_the_relay_waits_its_grace_period_for_what_is_in_flight_then_leaves_it_in_the_outbox() -> (
    None
):
    time = DrivenTime(stop_at=1.0)
    queue = MemoryQueue([_event(1), _event(2)])
    publisher = ScriptedPublisher({1: "silent"}, time)  # the broker never answers for 1
    settings = RelaySettings(idle_wait_s=0.25, stop_grace_s=2.0)
    _relay(queue, publisher, time, settings=settings).run(time)
    assert [row.outbox_id for row in queue.rows] == [1] and publisher.discarded == 1
    assert 1.0 + 2.0 <= time.now_s < 1.0 + 2.0 + 0.2  # the grace, and one look at the broker at most past it


def test_the_id_horizon_moves_only_past_ids_whose_writers_have_all_ended() -> None:
    horizon = IdHorizon()
    horizon.observe(10, [])
    assert horizon.final == 0  # one reading says nothing yet: an id taken before it may still commit
    horizon.observe(12, ["3/7"])  # 3/7 may hold an id up to 10 (read before it was seen)
    horizon.observe(15, ["3/7", "4/2"])
    assert horizon.final == 0
    horizon.observe(15, ["4/2"])  # 3/7 ended; 4/2 came after the reading of 10
    assert horizon.final == 10
    horizon.observe(16, ["4/2", "5/1"])  # waits for 4/2, which may hold an id up to 15
    assert horizon.final == 10
    horizon.observe(16, [])
    assert horizon.final == 16  # nobody writing: everything read one observation ago is final


def test_the_id_horizon_never_moves_back_and_says_when_the_sequence_did() -> None:
    horizon = IdHorizon()
    for last_value in (5, 9, 9):
        horizon.observe(last_value, [])
    with pytest.raises(OutboxIdsWentBackError) as went_back:
        horizon.observe(7, [])  # a sequence set back by hand: rows from now on lie below what was read
    assert (went_back.value.read_up_to, went_back.value.now_at) == (9, 7)
    assert horizon.final == 9


def test_the_id_horizon_stands_still_while_a_prepared_transaction_exists() -> None:
    horizon = IdHorizon()
    horizon.observe(10, [])
    horizon.observe(11, ["3/7"])
    horizon.observe(12, ["-1/900"], prepared=True)  # 3/7 prepared: its locks now go by another name
    assert horizon.final == 0
    horizon.observe(12, [])  # committed or rolled back: its rows are visible, or gone
    assert horizon.final == 11  # the last value read before this reading


class RecordingObserver(RelayObserver):
    """The hooks the relay called, in order: what operators see, and what tests can wait on."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def started(self) -> None:
        self.calls.append("started")

    def stopped(self) -> None:
        self.calls.append("stopped")

    def took_over(self) -> None:
        self.calls.append("took over")

    def backlog(self, backlog: OutboxBacklog) -> None:
        self.calls.append(f"backlog {backlog.waiting}")

    def dead_lettered(self, rejected: Mapping[int, str]) -> None:
        self.calls.append(f"dead-lettered {sorted(rejected)}")

    def delivery_failed(self, retry: Mapping[int, str]) -> None:
        self.calls.append(f"not delivered {sorted(retry)}")

    def failed(self, exc: Exception) -> None:
        self.calls.append(f"failed: {exc}")

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        self.calls.append(f"retrying {attempt}: {reason}")

    def topic_missing(self, topic: str, reason: str) -> None:
        self.calls.append(f"topic {topic} missing: {reason}")

    def topic_recreated(self, topic: str) -> None:
        self.calls.append(f"topic {topic} recreated")

    def topic_found(self, topic: str) -> None:
        self.calls.append(f"topic {topic} found")


def test_the_observer_hears_the_backlog_a_dead_letter_a_retry_and_the_end() -> None:
    queue = MemoryQueue([_event(n) for n in range(1, 8)])
    observer = RecordingObserver()

    time = DrivenTime()
    _relay(queue, ScriptedPublisher({2: "reject", 5: "retry"}), time, observer).run(time, once=True)

    assert observer.calls == [
        "started",
        "backlog 7",
        "dead-lettered [2]",
        "not delivered [5]",
        "retrying 1: _MSG_TIMED_OUT",
        "stopped",
    ]


def test_the_observer_hears_each_failure_and_back_off_until_stopped() -> None:
    observer, time = RecordingObserver(), DrivenTime()

    _relay(BrokenQueue(time, stand_downs=2), ScriptedPublisher({}), time, observer).run(time)

    failure = ["failed: database went away", "retrying {}: ConnectionError"]
    assert observer.calls == [
        "started",
        *(call.format(attempt) for attempt in (1, 2, 3) for call in failure),
        "stopped",
    ]


def test_the_observer_hears_a_takeover_before_anything_is_sent() -> None:
    queue = MemoryQueue([_event(1)], clean=False)
    observer, time = RecordingObserver(), DrivenTime()

    _relay(queue, ScriptedPublisher({}), time, observer).run(time, once=True)

    assert observer.calls == ["started", "took over", "backlog 1", "stopped"]


def test_a_missing_topic_holds_its_events_in_key_order_while_the_other_topics_go_on() -> None:
    """Topic t is missing: its rows stay in the outbox (dead-lettered never, re-read never while it is
    missing) and topic u goes on; once t is back its rows go, in key order."""
    rows = [_event(1, "a"), _event(2, "a"), _event(3, "b", topic="u"), _event(4, "c", topic="u")]
    queue = MemoryQueue(rows)
    publisher, observer, time = ScriptedPublisher({1: "held"}), RecordingObserver(), DrivenTime()
    settings = RelaySettings(batch_size=3, max_in_flight=6, idle_wait_s=0.25, max_backoff_s=0)

    _relay(queue, publisher, time, observer, settings).run(time, once=True)

    assert queue.rows == [] and queue.dead == {}
    # 1 is handed back (t missing) and 2, behind it, is left in the outbox; u's 4 goes meanwhile; t is
    # found at the second look, and its rows are read again: 1, then 2.
    assert publisher.sent == [[1, 3], [4], [1], [2]]
    assert publisher.looks == {"t": 2}
    assert observer.calls == [
        "started",
        "topic t missing: the relay does not create topics",
        "not delivered [1]",
        "backlog 4",
        "topic t found",
        "stopped",
    ]


def test_the_observer_warns_readiness_and_sets_its_gauge_while_a_topic_is_missing() -> None:
    observer = RelayObserver()
    gauge = "identity_outbox_topic_missing"
    assert observer.missing_topics() is None

    with capture_logs() as logs:
        observer.topic_missing("pin.identity.users.v1", "creation failed: TOPIC_AUTHORIZATION_FAILED: denied")
        observer.topic_missing("pin.identity.access.v1", "the relay does not create topics")
    assert observer.missing_topics() == (
        "the outbox relay holds the events of pin.identity.access.v1: the broker does not have the topic (the"
        " relay does not create topics); the outbox relay holds the events of pin.identity.users.v1: the"
        " broker does not have the topic (creation failed: TOPIC_AUTHORIZATION_FAILED: denied)"
    )
    assert REGISTRY.get_sample_value(gauge, {"topic": "pin.identity.access.v1"}) == 1
    assert [(log["event"], log["topic"]) for log in logs] == [
        ("outbox-topic-missing", "pin.identity.users.v1"),
        ("outbox-topic-missing", "pin.identity.access.v1"),
    ]

    observer.topic_found("pin.identity.access.v1")
    observer.topic_recreated("pin.identity.users.v1")
    assert observer.missing_topics() is None
    assert REGISTRY.get_sample_value(gauge, {"topic": "pin.identity.access.v1"}) == 0
    assert REGISTRY.get_sample_value(gauge, {"topic": "pin.identity.users.v1"}) == 0


SHORTFALL = (
    "pin.identity.access.v1 has 1 of 3 replicas in sync (partitions 0) and needs 2 for a write"
    " (NOT_ENOUGH_REPLICAS)"
)


class ShortOfReplicas(ScriptedPublisher):
    """A broker that says its partitions have too few replicas in sync; counts how often it was asked."""

    def __init__(self, script: dict[int, str]):
        super().__init__(script)
        self.asked = 0

    def replication_shortfall(self) -> str | None:
        self.asked += 1
        return SHORTFALL


def test_publishing_that_keeps_failing_asks_the_broker_why_and_readiness_says_too_few_replicas() -> None:
    observer, time = RelayObserver(), DrivenTime()
    publisher = ShortOfReplicas({})

    with capture_logs() as logs:
        _relay(BrokenQueue(time, stand_downs=2), publisher, time, observer).run(time)

    assert publisher.asked == 2  # not after the first failure (a blip), after the second and the third
    assert observer.readiness_warning() == f"the outbox relay cannot publish: {SHORTFALL}"
    assert [log["shortfall"] for log in logs if log["event"] == "outbox-replicas-short"] == [SHORTFALL]


def test_a_delivery_after_failures_ends_the_too_few_replicas_warning() -> None:
    queue = MemoryQueue([_event(1), _event(2)])
    observer, time = RelayObserver(), DrivenTime()
    observer.replicas_short(SHORTFALL)
    observer.topic_missing("pin.identity.users.v1", "the relay does not create topics")
    assert observer.readiness_warning() == (
        "the outbox relay holds the events of pin.identity.users.v1: the broker does not have the topic (the"
        f" relay does not create topics); the outbox relay cannot publish: {SHORTFALL}"
    )
    observer.topic_found("pin.identity.users.v1")

    with capture_logs() as logs:
        _relay(queue, ShortOfReplicas({1: "retry"}), time, observer).run(time, once=True)

    assert queue.rows == [] and queue.dead == {}
    assert observer.readiness_warning() is None
    assert [log["event"] for log in logs if log["event"].startswith("outbox-replicas")] == [
        "outbox-replicas-in-sync"
    ]


class LateBroker(ScriptedPublisher):
    """Acknowledges nothing before `answers_at` on the relay's clock (a lost coordinator, a leader moving);
    from then on, everything sent."""

    def __init__(self, time: DrivenTime, answers_at: float):
        super().__init__({}, time)
        self._time_now, self._answers_at = time, answers_at
        self.first_answer_at: float | None = None

    def collect(self, timeout_s: float) -> PublishReport:
        if self._time_now.now_s < self._answers_at:
            self._time_now.pass_time(timeout_s)
            return PublishReport()
        report = super().collect(timeout_s)
        if report.delivered and self.first_answer_at is None:
            self.first_answer_at = self._time_now.now_s
        return report


def test_a_broker_that_acknowledges_nothing_is_said_on_readiness_and_in_the_log_until_it_does() -> None:
    time = DrivenTime(stop_at=12.0)
    queue = MemoryQueue([_event(1), _event(2)])
    readiness: list[tuple[float, str | None]] = []

    class Watched(RelayObserver):
        def unacknowledged(self, waited_s: float) -> None:
            super().unacknowledged(waited_s)
            readiness.append((time.now_s, self.readiness_warning()))

    settings = RelaySettings(idle_wait_s=0.25)
    broker = LateBroker(time, answers_at=8.0)
    with capture_logs() as logs:
        _relay(queue, broker, time, Watched(), settings).run(time)

    assert queue.rows == []
    warned = [(at, warning) for at, warning in readiness if warning is not None]
    assert warned[0] == (5.0, "the outbox relay has waited 5 s for the broker to acknowledge its events")
    ended = readiness[readiness.index(warned[-1]) + 1]
    assert ended == (broker.first_answer_at, None)  # said until the broker acknowledged, not a beat later
    assert REGISTRY.get_sample_value("identity_outbox_unacknowledged_seconds") == 0  # idle: nothing waits
    said = [
        (log["event"], log.get("waited_s", log.get("silent_s"))) for log in logs if "broker" in log["event"]
    ]
    assert said == [("outbox-broker-silent", 5.0), ("outbox-broker-acknowledges", 8.0)]


def test_one_key_on_two_topics_orders_each_topic_apart() -> None:
    """A user's UserUpserted (topic u) and UserAccessChanged (topic t) share its key: the access event does
    not wait for the upsert, and each topic's events of the key keep their order."""
    rows = [_event(1, "a", topic="u"), _event(2, "a"), _event(3, "a", topic="u"), _event(4, "a")]
    queue, publisher, time = MemoryQueue(rows), ScriptedPublisher({}), DrivenTime()

    _relay(queue, publisher, time).run(time, once=True)

    assert publisher.sent[0] == [1, 2]  # one of each topic at once
    assert sorted(n for batch in publisher.sent[1:] for n in batch) == [3, 4] and queue.rows == []


class PartitionDown(ScriptedPublisher):
    """Topic t's partition 0 (keys "down*") takes no write until `back_at`: its events fail naming it, and
    the broker says so when asked; every other partition takes everything."""

    def __init__(self, time: DrivenTime, back_at: float):
        super().__init__({}, time)
        self._clock, self._back_at = time, back_at

    def partition(self, topic: str, key: str) -> int | None:
        return 0 if key.startswith("down") else 1

    def unwritable(self, places: Collection[Place]) -> dict[Place, str]:
        down = ("t", 0) in places and self._clock.now_s < self._back_at
        return {("t", 0): "1 replicas in sync, 2 needed (NOT_ENOUGH_REPLICAS)"} if down else {}

    def send(self, events: Sequence[PendingEvent]) -> PublishReport:
        self.sent.append([e.outbox_id for e in events])
        for event in events:
            if event.key.startswith("down") and self._clock.now_s < self._back_at:
                self._answers.retry[event.outbox_id] = "NOT_ENOUGH_REPLICAS"
                self._answers.failing[("t", 0)] = "NOT_ENOUGH_REPLICAS"
            else:
                self._answers.delivered.append(event.outbox_id)
        return PublishReport()


def test_a_partition_that_takes_no_write_keeps_its_events_back_and_no_other() -> None:
    rows = [_event(1, "down-a"), _event(2, "up-b"), _event(3, "down-a"), _event(4, "up-c"), _event(5, "up-d")]
    queue, time = MemoryQueue(rows), DrivenTime()
    publisher = PartitionDown(time, back_at=5.0)
    settings = RelaySettings(batch_size=5, max_in_flight=10, idle_wait_s=0.25, max_backoff_s=1.0)

    _relay(queue, publisher, time, settings=settings).run(time, once=True)

    assert queue.rows == [] and queue.dead == {}
    sent_while_down = [n for batch in publisher.sent[:-2] for n in batch]
    assert {2, 4, 5} <= set(sent_while_down)  # the other partition went at once
    assert sent_while_down.count(1) == 1  # once failed, 1 is not sent again until the broker says it is back
    assert publisher.sent[-2:] == [[1], [3]]  # then 1, and 3 behind it (same key)


class FencedFromOutside(ScriptedPublisher):
    """The first `fences` sends find the producer fenced: a relay of another outbox initialised the same
    transactional.id meanwhile."""

    def __init__(self, fences: int, time: DrivenTime):
        super().__init__({}, time)
        self.fences = fences

    def send(self, events: Sequence[PendingEvent]) -> PublishReport:
        if self.fences:
            self.fences -= 1
            raise ProducerFencedError(
                "PRODUCER_FENCED: There is a newer producer with the same transactionalId"
            )
        return super().send(events)


class LockLostQueue(MemoryQueue):
    def still_active(self) -> bool:
        return False


def _fenced_run(fences: int, queue: MemoryQueue) -> tuple[RelayObserver, list[str]]:
    time, observer = DrivenTime(), RelayObserver()
    with capture_logs() as logs:
        _relay(queue, FencedFromOutside(fences, time), time, observer).run(time, once=True)
    assert queue.rows == [], "every event goes out between the fences"
    return observer, [entry["event"] for entry in logs if "transactional-id" in entry["event"]]


def test_a_relay_fenced_twice_while_it_holds_the_lock_says_its_transactional_id_is_shared() -> None:
    observer, said = _fenced_run(3, MemoryQueue([_event(n) for n in range(1, 4)]))

    assert said == ["outbox-transactional-id-shared"]  # once, however many fences follow
    warning = observer.readiness_warning()
    assert warning is not None and "was fenced 3 times in 300 s while it held the lock" in warning


@pytest.mark.parametrize(
    ("fences", "queue"),
    [(1, MemoryQueue([_event(1)])), (2, LockLostQueue([_event(1)]))],
    ids=["fenced once: a relay of the outbox froze before its start", "fenced after its lock went"],
)
def test_a_relay_fenced_once_or_after_losing_its_lock_says_nothing_of_a_shared_id(
    fences: int, queue: MemoryQueue
) -> None:
    observer, said = _fenced_run(fences, queue)

    assert said == []
    assert observer.readiness_warning() is None


def test_the_shared_transactional_id_warning_ends_once_a_window_passes_without_a_fence() -> None:
    time, observer = DrivenTime(), RelayObserver()
    queue = MemoryQueue([_event(1)])
    relay = _relay(queue, FencedFromOutside(2, time), time, observer)
    relay.run(time, once=True)
    assert observer.readiness_warning() is not None

    time.pass_time(301)
    queue.rows.append(_event(2))
    with capture_logs() as logs:
        relay.run(DrivenTime(), once=True)

    assert observer.readiness_warning() is None
    assert [entry["event"] for entry in logs if "transactional-id" in entry["event"]] == [
        "outbox-transactional-id-alone"
    ]


def test_the_relay_hands_its_producer_no_more_bytes_than_its_flight_budget_and_a_larger_event_alone() -> None:
    """memory_mb 16: 4 MiB in flight at most (the producer's queue holds copies of them until answered)."""
    settings = FAST.model_copy(update={"memory_mb": 16, "batch_size": 50, "max_in_flight": 100})
    mib = 2**20
    sizes = [mib] * 6 + [5 * mib, mib]
    queue = MemoryQueue([_event(n, size=size) for n, size in enumerate(sizes, start=1)])
    time = DrivenTime()
    publisher = ScriptedPublisher(dict.fromkeys(range(1, 9), "silent"), time)
    relay = _relay(queue, publisher, time, settings=settings)

    for _ in range(3):
        relay.step(time)
    assert [n for batch in publisher.sent for n in batch] == [1, 2, 3, 4]  # the broker answers none

    publisher.script = dict.fromkeys(range(1, 9), "ok")  # it answers those four, and what comes next
    publisher.answer_later([1, 2, 3, 4])
    for _ in range(6):
        relay.step(time)
    assert publisher.sent[1:] == [[5, 6], [7], [8]]

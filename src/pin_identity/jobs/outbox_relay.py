"""The outbox relay: publishes committed outbox rows to Kafka and removes them once acknowledged."""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pin_identity.config import RelaySettings
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import OutboxIdsWentBackError
from pin_identity.jobs.outbox_relay_observer import RelayObserver
from pin_identity.operations.ports.job_control import StopSignal
from pin_identity.operations.ports.outbox import (
    EventPublisher,
    OutboxQueue,
    PendingEvent,
    Place,
    ProducerFencedError,
    PublishReport,
    RelayRole,
)

# Publishing that failed this many times in a row has the broker asked whether too few replicas are in sync
# (a blip recovers at its first retry without the question).
_ASK_WHY_AFTER = 2
# How often the broker is asked whether a held topic is back.
_HOLD_LOOK_EVERY_S = 2.0
# Fenced twice within this long while holding the lock: a producer outside the outbox uses its
# transactional.id. Said until this long passes without a fence.
_SHARED_ID_WINDOW_S = 300.0
# An event's place in the key order: its topic and its key (CONTRACTS section 4 orders an aggregate's
# events on one topic; a user's UserUpserted and UserAccessChanged share a key, not a topic, and neither
# waits for the other).
TopicKey = tuple[str, str]


@dataclass
class _Cadence:
    """A chore that falls due at most once per `every_s` of the relay's clock (at once the first time)."""

    every_s: float
    due_at: float = -math.inf

    def due(self, now: float) -> bool:
        """Whether the chore is due now; if so, it is not again for `every_s`."""
        if now < self.due_at:
            return False
        self.due_at = now + self.every_s
        return True

    def make_due(self) -> None:
        self.due_at = -math.inf


@dataclass
class _Wait:
    """Since when the relay has waited for the broker to acknowledge its events: from the first event handed
    out while none waited, moved on by every acknowledgement, kept through failures and back-offs (the events
    still wait), ended only when nothing is left to publish."""

    since: float | None = None

    def sent(self, now: float) -> None:
        if self.since is None:
            self.since = now

    def acknowledged(self, now: float, *, more_waiting: bool) -> None:
        self.since = now if more_waiting else None

    def end(self) -> None:
        self.since = None

    def seconds(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since


def _topic_key(event: PendingEvent) -> TopicKey:
    return event.topic, event.key


class _Rows:
    """What the relay read from the outbox and has not settled, in rows and bytes (reading stops while either
    is full). At most one event of a (topic, key) is in flight; the later rows of that key wait, in outbox
    order, until it is answered. An event the broker did not take is again the first of its key, to go again,
    or parked with its partition while that partition cools down."""

    def __init__(self) -> None:
        self.in_flight: dict[int, PendingEvent] = {}
        self.in_flight_bytes = 0
        self.count = 0
        self.bytes = 0
        self._busy: set[TopicKey] = set()  # keys with an event in flight, ready or parked
        self._waiting: dict[TopicKey, deque[PendingEvent]] = {}  # behind their key's first
        self._ready: list[PendingEvent] = []  # each the first of its key: to send
        self._parked: dict[Place, list[PendingEvent]] = {}  # the first of their key, their partition cooling

    @property
    def has_ready(self) -> bool:
        return bool(self._ready)

    @property
    def held(self) -> int:
        """Rows read and waiting behind an earlier event of their key."""
        return sum(map(len, self._waiting.values()))

    def admit(self, fetched: Iterable[PendingEvent]) -> None:
        busy, waiting, ready = self._busy, self._waiting, self._ready  # once per row: kept lean
        for row in fetched:
            self.count += 1
            self.bytes += len(row.value)
            key = (row.topic, row.key)
            if key in busy:
                waiting.setdefault(key, deque()).append(row)
            else:
                busy.add(key)
                ready.append(row)

    def take_ready(self, flight_bytes: int) -> list[PendingEvent]:
        """The ready events that fit in flight beside what is there (`flight_bytes` in all; an event larger
        than that goes alone, once nothing else is in flight)."""
        room = flight_bytes - self.in_flight_bytes
        taken = 0
        for event in self._ready:
            if room < len(event.value) and (taken or self.in_flight):
                break
            room -= len(event.value)
            taken += 1
        ready, self._ready = self._ready[:taken], self._ready[taken:]
        return ready

    def ready_again(self, events: Iterable[PendingEvent]) -> None:
        self._ready.extend(events)

    def sent(self, events: Iterable[PendingEvent]) -> None:
        for event in events:
            self.in_flight[event.outbox_id] = event
            self.in_flight_bytes += len(event.value)

    def settled(self, outbox_ids: Iterable[int]) -> None:
        """Gone from the outbox (acknowledged, or dead-lettered): the next row of each one's key goes."""
        for outbox_id in outbox_ids:
            event = self.in_flight.pop(outbox_id, None)
            if event is not None:
                self.in_flight_bytes -= len(event.value)
                self._forget(event)
                self._next_of(_topic_key(event))

    def unanswered(self, outbox_ids: Iterable[int]) -> list[PendingEvent]:
        """Events the broker did not take, out of flight: each still the first of its key."""
        events = [self.in_flight.pop(outbox_id) for outbox_id in outbox_ids if outbox_id in self.in_flight]
        self.in_flight_bytes -= sum(len(event.value) for event in events)
        return events

    def park(self, place: Place, events: Iterable[PendingEvent]) -> None:
        self._parked.setdefault(place, []).extend(events)

    def unpark(self, place: Place) -> None:
        self._ready.extend(self._parked.pop(place, ()))

    def parked(self) -> int:
        return sum(map(len, self._parked.values()))

    def drop_topic(self, topic: str, events: Iterable[PendingEvent] = ()) -> int | None:
        """Forget every row of `topic` not in flight (and `events`, which were): they stay in the outbox, to
        be read again once the topic is back. The lowest outbox id forgotten, None when none was."""
        dropped = [event for event in events if event.topic == topic]
        dropped += [event for event in self._ready if event.topic == topic]
        self._ready = [event for event in self._ready if event.topic != topic]
        for place in [place for place in self._parked if place[0] == topic]:
            dropped += self._parked.pop(place)
        for key in [key for key in self._waiting if key[0] == topic]:
            dropped += self._waiting.pop(key)
        for event in dropped:
            self._forget(event)
        in_flight = {_topic_key(event) for event in self.in_flight.values()}
        self._busy = {key for key in self._busy if key[0] != topic or key in in_flight}
        return min((event.outbox_id for event in dropped), default=None)

    def forget(self) -> None:
        """Forget everything, what is in flight too (its producer was discarded)."""
        self.in_flight.clear()
        self._busy.clear()
        self._waiting.clear()
        self._ready.clear()
        self._parked.clear()
        self.count = self.bytes = self.in_flight_bytes = 0

    def _forget(self, event: PendingEvent) -> None:
        self.count -= 1
        self.bytes -= len(event.value)

    def _next_of(self, key: TopicKey) -> None:
        waiting = self._waiting.get(key)
        if not waiting:
            self._busy.discard(key)
            return
        self._ready.append(waiting.popleft())  # its key stays busy
        if not waiting:
            del self._waiting[key]


@dataclass
class _Lanes:
    """How far the relay has read the outbox. The main lane reads every topic not held up to `position`. A
    held topic (the broker does not have it) is read no further: its rows above `held[topic]` stay in the
    outbox, not re-read in a loop. Once it is back it is read on its own from there (`catching_up`) up to
    where the main lane stands, and then joins it; its keys keep their order, as one topic is always read in
    one lane."""

    position: int = 0
    held: dict[str, int] = field(default_factory=dict)
    catching_up: dict[str, int] = field(default_factory=dict)

    def skipped(self) -> list[str]:
        """The topics the main lane does not read."""
        return [*self.held, *self.catching_up]

    def hold(self, topic: str, lowest_dropped: int | None) -> None:
        """Read no further; its rows from `lowest_dropped` (else from where it was read up to) are read again
        when it is back. Lowered when more of its rows come back later."""
        read_up_to = self.catching_up.pop(topic, self.position)
        if lowest_dropped is not None:
            read_up_to = min(read_up_to, lowest_dropped - 1)
        self.held[topic] = min(self.held.get(topic, read_up_to), read_up_to)

    def release(self, topic: str) -> None:
        if topic in self.held:
            self.catching_up[topic] = self.held.pop(topic)

    def caught_up(self, topic: str, upto: int) -> None:
        if upto >= self.position:
            del self.catching_up[topic]
        else:
            self.catching_up[topic] = upto

    def reset(self) -> None:
        """From the outbox's first row again, nothing held (a new session: what is missing is found again)."""
        self.position = 0
        self.held.clear()
        self.catching_up.clear()


@dataclass
class _Cooling:
    """Partitions whose events failed (too few replicas in sync, no leader, a delivery timed out): their
    events and their keys' later rows stay out of the transactions until `until`, growing with each failure
    in a row; the other partitions and topics go on."""

    until: dict[Place, float] = field(default_factory=dict)
    failures: dict[Place, int] = field(default_factory=lambda: defaultdict(int))

    def cool(self, place: Place, now: float, delay: Callable[[int], float]) -> float:
        self.failures[place] += 1
        pause = delay(self.failures[place])
        self.until[place] = now + pause
        return pause

    def due(self, now: float) -> list[Place]:
        return [place for place, until in self.until.items() if until <= now]

    def warm(self, place: Place) -> None:
        self.until.pop(place, None)
        self.failures.pop(place, None)


@dataclass
class _Fences:
    """When this relay's producer was fenced while the relay held the lock, where no relay of its outbox can
    have taken the transactional.id: a producer outside the outbox did (an operator-set transactional.id
    shared by two outboxes, whose relays fence each other for ever, each committing between two fences)."""

    at: list[float] = field(default_factory=list)

    def fenced(self, now: float) -> int:
        """How many times within the window, this one included."""
        self.at = [*(when for when in self.at if now - when < _SHARED_ID_WINDOW_S), now]
        return len(self.at)

    def ended(self, now: float) -> bool:
        """Whether a window has passed since the last fence (and forget them)."""
        if not self.at or now - self.at[-1] < _SHARED_ID_WINDOW_S:
            return False
        self.at = []
        return True


class OutboxRelay:
    """One active relay at a time (the queue's lock); the others stand by and take over when it dies.

    Ordering per topic and key does not depend on the producer: at most one event of a (topic, key) is in
    flight at a time, so an event the broker did not take (an error, a timeout, an outage of any length) is
    sent again before anything newer of that key is handed to the producer. Rows leave the outbox only once
    the broker acknowledged them (or rejected them for good). A relay that stops, fails or loses its lock
    first discards its producer, so nothing it handed out can land behind the next relay's events.

    One topic, partition or event never holds the others. A topic the broker does not have is held: its rows
    stay in the outbox, read again once it is back, while the other topics go on. A partition that cannot
    take a write is cooled down: its events wait, the others are sent at once. What is read and held is
    bounded in rows (`max_in_flight`) and in bytes (`memory_mb`).

    Time is the `clock`'s monotonic seconds (the cadences of the heartbeat and the backlog, the back-offs, the
    grace period at stop); pauses are waits on the stop signal. A test that drives both runs the relay
    without sleeping.
    """

    def __init__(
        self,
        queue: OutboxQueue,
        publisher: EventPublisher,
        settings: RelaySettings,
        observer: RelayObserver | None = None,
        *,
        clock: Clock,
    ):
        self._queue = queue
        self._publisher = publisher
        self._settings = settings
        self._observer = observer or RelayObserver()
        self._clock = clock
        self._rows = _Rows()
        self._lanes = _Lanes()
        self._cooling = _Cooling()
        self._fences = _Fences()
        self._heartbeat = _Cadence(settings.heartbeat_every_s)
        self._backlog = _Cadence(settings.backlog_every_s)
        self._hold_look = _Cadence(_HOLD_LOOK_EVERY_S)
        self._failures = 0  # in a row, without a partition to blame: the back-off grows with them
        self._paused_until = -math.inf  # nothing is handed out before (a back-off)
        self._wait = _Wait()

    @property
    def in_flight(self) -> int:
        """Events handed to the producer and not yet answered (a count another thread may read: tests wait on
        it)."""
        return len(self._rows.in_flight)

    @property
    def held(self) -> int:
        """Rows read and waiting behind an earlier event of their key still in flight (a count another
        thread may read: tests wait on it)."""
        return self._rows.held

    def run(self, stop: StopSignal, *, once: bool = False, until: Callable[[], bool] = lambda: True) -> None:
        """Relay until stopped; with `once`, until `until()` holds (the process's other jobs have ended)
        and no committed row is left in the outbox."""
        self._observer.started()
        try:
            self._loop(stop, once=once, until=until)
            self._finish_in_flight()
        finally:
            self._stand_down()  # a standby takes over at once instead of waiting for a timeout
        self._observer.stopped()

    def _loop(self, stop: StopSignal, *, once: bool, until: Callable[[], bool]) -> None:
        while not stop.is_set():
            try:
                pause = self.step(stop)
                if pause is None:
                    continue
                if once and until() and self._queue.is_drained():
                    return  # before the pause: --once ends as soon as the outbox is empty
                stop.wait(pause)
            except OutboxIdsWentBackError as exc:  # a new session reads from the outbox's first row again
                self._observer.ids_went_back(exc.read_up_to, exc.now_at)
                self._stand_down()
            except Exception as exc:  # any failure: stop the producer, drop the session, back off
                self._observer.failed(exc)
                if isinstance(exc, ProducerFencedError):
                    self._fenced()
                self._stand_down()
                self._back_off(stop, reason=type(exc).__name__)

    def step(self, stop: StopSignal) -> float | None:
        """Send what is ready, settle the broker's answers; how long to pause before the next step when
        there is nothing to do (None while there is)."""
        role = self._queue.try_become_active()
        if role is RelayRole.STANDBY:
            self._wait.end()  # the active relay says what it waits for
            return self._settings.standby_wait_s
        if role is RelayRole.TAKEN_OVER:
            # No grace period: starting its producer fences the old relay's at the broker (the publisher's
            # transactional.id), so nothing the old one still holds can land after this one's first event.
            self._observer.took_over()
        self._publisher.start()  # before the first read: the producer gets its id while the relay reads
        now = self._clock.monotonic()
        self._look_at_holds(now)
        sent = self._send_next(now)
        self._keep_alive()  # after the batch went: the broker works on it meanwhile
        waiting = not sent and self._rows.in_flight  # for the broker's first answer, not for nothing
        self._settle(self._publisher.collect(self._settings.idle_wait_s if waiting else 0))
        if sent or self._rows.in_flight:
            return None
        if self._paused_until > self._clock.monotonic():
            return max(self._paused_until - self._clock.monotonic(), 0.0)
        self._wait_ended()
        return self._settings.idle_wait_s

    def _wait_ended(self) -> None:
        if self._wait.since is not None:
            self._wait.end()
            self._observer.unacknowledged(0.0)

    def _keep_alive(self) -> None:
        now = self._clock.monotonic()
        if self._heartbeat.due(now):
            self._queue.heartbeat()
            self._observer.unacknowledged(self._wait.seconds(now))
        if self._backlog.due(now):
            self._observer.backlog(self._queue.backlog())

    # ------------------------------------------------------------ reading and sending

    def _send_next(self, now: float) -> int:
        """How many events were handed to the producer: what is ready after reading what there is room for
        (none while a back-off lasts)."""
        if now < self._paused_until:
            return 0
        self._read_more()
        ready = self._rows.take_ready(self._settings.flight_bytes)
        if self._cooling.until and ready:
            ready = self._leave_out_cooling(ready)
        self._dispatch(ready)
        return len(ready)

    def _read_more(self) -> None:
        """Rows of the catching-up topics, then of the main lane, while there is room in rows and bytes."""
        lanes = self._lanes
        for topic, after in list(lanes.catching_up.items()):
            if (room := self._room()) is None:
                return
            fetched = self._queue.fetch_topic(topic, room[0], after, lanes.position, max_bytes=room[1])
            self._rows.admit(fetched.events)
            lanes.caught_up(topic, fetched.upto)
        if (room := self._room()) is not None:
            fetched = self._queue.fetch_ready(
                room[0], lanes.position, max_bytes=room[1], skip_topics=lanes.skipped()
            )
            self._rows.admit(fetched.events)
            lanes.position = max(lanes.position, fetched.upto)

    def _room(self) -> tuple[int, int] | None:
        """How many rows, and bytes of values, may be read now; None while there is no room for a batch."""
        settings = self._settings
        rows = min(settings.batch_size, settings.max_in_flight - self._rows.count)
        free = settings.held_bytes - self._rows.bytes
        if rows < min(settings.batch_size, settings.max_in_flight) // 2 or free <= 0:
            return None
        return rows, min(free, settings.read_bytes)

    def _leave_out_cooling(self, ready: list[PendingEvent]) -> list[PendingEvent]:
        """The events of cooling partitions are parked with their partition; the others go."""
        going = []
        for event in ready:
            place = self._place_of(event)
            if place is not None and place in self._cooling.until:
                self._rows.park(place, [event])
            else:
                going.append(event)
        return going

    def _place_of(self, event: PendingEvent) -> Place | None:
        partition = self._publisher.partition(event.topic, event.key)
        return None if partition is None else (event.topic, partition)

    def _dispatch(self, ready: list[PendingEvent]) -> None:
        """Hand rows to the producer (its at-once answers are settled like any others)."""
        if not ready:
            return
        self._rows.sent(ready)
        self._wait.sent(self._clock.monotonic())
        self._settle(self._publisher.send(ready))

    # ------------------------------------------------------------ answers

    def _settle(self, report: PublishReport) -> None:
        """Record the broker's answers; a held row whose key they free goes with the next batch."""
        for topic, reason in report.topics_missing.items():
            self._hold(topic)
            self._observer.topic_missing(topic, reason)
        if report.delivered or report.rejected:
            self._queue.settle(report.delivered, report.rejected)
            self._rows.settled(report.delivered)
            self._rows.settled(report.rejected)
        if report.delivered:
            self._wait.acknowledged(self._clock.monotonic(), more_waiting=bool(self._rows.in_flight))
            self._observer.unacknowledged(0.0)  # a silence ends with the answer, not a beat later
            if self._failures:
                self._observer.publishing_resumed()
            self._failures = 0
            if self._fences.ended(self._clock.monotonic()):
                self._observer.transactional_id_alone()
        if report.rejected:
            self._observer.dead_lettered(report.rejected)
        if report.retry:
            self._observer.delivery_failed(report.retry)
            self._again(report)
        # Last: a topic recreated or found in this very report takes back the events just handed back for it.
        self._topics_back(report)

    def _again(self, report: PublishReport) -> None:
        """Events the broker did not take: a held topic's (the broker said it does not have it: `_settle`
        held it first) are left in the outbox, a failing partition's wait for it to cool down, the rest (gone
        down with their transaction) go again at once, unless nothing says what failed: then everything waits
        a back-off."""
        now = self._clock.monotonic()
        events = self._rows.unanswered(report.retry)
        for topic in {event.topic for event in events if event.topic in self._lanes.held}:
            self._hold(topic, events)  # its rows come back with the topic
        events = [event for event in events if event.topic not in self._lanes.held]
        for place, reason in report.failing.items():
            if place not in self._cooling.until:
                pause = self._cooling.cool(place, now, self._settings.backoff.delay)
                self._observer.partition_failing(place, reason, pause)
        if report.failing:
            self._partitions_failing()
        again, blamed = [], False
        for event in events:
            cooling = self._place_of(event)
            if cooling is not None and cooling in self._cooling.until:
                self._rows.park(cooling, [event])
                blamed = True
            else:
                again.append(event)
        self._rows.ready_again(again)
        if not blamed and not report.failing and again:
            self._pause(reason=next(iter(report.retry.values())))

    def _partitions_failing(self) -> None:
        """Partitions keep failing: past the first time, the broker is asked whether too few replicas in sync
        are why (said on /readyz while it lasts)."""
        self._failures += 1
        if self._failures >= _ASK_WHY_AFTER:
            self._observer.replicas_short(self._publisher.replication_shortfall())

    def _pause(self, *, reason: str) -> None:
        """Nothing said which partition failed (the broker away, a coordinator lost): everything waits a
        back-off, growing with the failures in a row."""
        self._failures += 1
        if self._failures >= _ASK_WHY_AFTER:
            self._observer.replicas_short(self._publisher.replication_shortfall())
        delay = self._settings.backoff.delay(self._failures)
        self._paused_until = self._clock.monotonic() + delay
        self._observer.retrying(reason, self._failures, delay)

    def _hold(self, topic: str, events: Iterable[PendingEvent] = ()) -> None:
        """The broker does not have `topic`: its rows are forgotten, to be read again once it is back."""
        self._lanes.hold(topic, self._rows.drop_topic(topic, events))

    def _topics_back(self, report: PublishReport) -> None:
        """A held topic of the relay's was recreated, or is back: its rows are read again, from where it was
        left."""
        for topic in report.topics_recreated:
            self._lanes.release(topic)
            self._observer.topic_recreated(topic)
        for topic in report.topics_found:
            self._lanes.release(topic)
            self._observer.topic_found(topic)

    def _look_at_holds(self, now: float) -> None:
        """Held topics: are they back? Cooled partitions: can they take a write again?"""
        if self._lanes.held and self._hold_look.due(now):
            self._settle(self._publisher.look_for(list(self._lanes.held)))
        due = self._cooling.due(now)
        if not due:
            return
        still = self._publisher.unwritable(due)  # the broker says so: no event is sent to find out
        for place in due:
            if place in still:  # cooled again, said once already
                self._cooling.cool(place, now, self._settings.backoff.delay)
                continue
            self._cooling.warm(place)
            self._rows.unpark(place)
            self._observer.partition_back(place)
        if still:
            self._partitions_failing()

    # ------------------------------------------------------------ stopping

    def _finish_in_flight(self) -> None:
        """On stop: give what is in flight a grace period; what stays unanswered is sent again later."""
        deadline = self._clock.monotonic() + self._settings.stop_grace_s
        while self._rows.in_flight and self._clock.monotonic() < deadline:
            self._settle(self._publisher.collect(0.2))  # the held rows stay in the outbox for later

    def _stand_down(self) -> None:
        """Discard the producer (what it still holds stays in the outbox), then hand the lock over."""
        self._publisher.discard()
        self._rows.forget()
        self._lanes.reset()
        self._cooling = _Cooling()
        self._paused_until = -math.inf
        self._heartbeat.make_due()
        self._hold_look.make_due()
        self._queue.stand_down()

    def _fenced(self) -> None:
        """The producer was fenced. While the relay still holds the lock (asked before it stands down) no
        relay of this outbox took over: twice within the window, it is said."""
        if self._queue.still_active():
            fences = self._fences.fenced(self._clock.monotonic())
            if fences >= 2:
                self._observer.transactional_id_shared(fences, _SHARED_ID_WINDOW_S)

    def _back_off(self, stop: StopSignal, *, reason: str) -> None:
        self._failures += 1
        if self._failures >= _ASK_WHY_AFTER:
            self._observer.replicas_short(self._publisher.replication_shortfall())
        # the heartbeat's may not come
        self._observer.unacknowledged(self._wait.seconds(self._clock.monotonic()))
        delay = self._settings.backoff.delay(self._failures)
        self._observer.retrying(reason, self._failures, delay)
        stop.wait(delay)

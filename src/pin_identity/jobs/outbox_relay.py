"""The outbox relay: publishes committed outbox rows to Kafka and removes them once acknowledged."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pin_identity.config import RelaySettings
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import OutboxIdsWentBackError
from pin_identity.jobs.outbox_relay_observer import RelayObserver
from pin_identity.operations.ports.job_control import StopSignal
from pin_identity.operations.ports.outbox import (
    EventPublisher,
    OutboxQueue,
    PendingEvent,
    PublishReport,
    RelayRole,
)

# Publishing that failed this many times in a row has the broker asked whether too few replicas are in sync
# (a blip recovers at its first retry without the question).
_ASK_WHY_AFTER = 2


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


class _KeyOrder:
    """What the relay read from the outbox and has not settled: at most one event of a key is in flight, and
    the later rows of that key are held, in outbox order, until it is answered."""

    def __init__(self) -> None:
        self.in_flight: dict[int, str] = {}  # outbox id -> key
        self.held_count = 0
        # Every row up to this id has been read (and is in flight, held, or gone): the next read starts after
        # it, so it never steps over rows in flight. Back to 0 on a rewind.
        self.read_upto = 0
        self._keys_in_flight: set[str] = set()
        self._held: dict[str, deque[PendingEvent]] = {}  # rows waiting for their key's event in flight
        self._released: list[PendingEvent] = []  # held rows whose key was just answered: sent next

    def room(self, max_in_flight: int) -> int:
        """How many more rows may be read (in flight, held and released ones count)."""
        return max_in_flight - len(self.in_flight) - self.held_count - len(self._released)

    def take_released(self) -> list[PendingEvent]:
        """The held rows whose key's event was answered: each now the first of its key to go."""
        released, self._released = self._released, []
        return released

    def admit(self, fetched: list[PendingEvent]) -> list[PendingEvent]:
        """The oldest row of each key that has none in flight; the later ones wait for its answer."""
        if fetched:
            self.read_upto = fetched[-1].outbox_id
        chosen = []
        busy, held = self._keys_in_flight, self._held
        for row in fetched:
            if row.key in busy or row.key in held:
                held.setdefault(row.key, deque()).append(row)
                self.held_count += 1
            else:
                busy.add(row.key)
                chosen.append(row)
        return chosen

    def sent(self, events: list[PendingEvent]) -> None:
        for event in events:
            self.in_flight[event.outbox_id] = event.key
            self._keys_in_flight.add(event.key)

    def answered(self, outbox_ids: Iterable[int]) -> None:
        """Forget events in flight; the next held row of each one's key is released."""
        in_flight, held = self.in_flight, self._held  # once per answer: kept lean
        for outbox_id in outbox_ids:
            key = in_flight.pop(outbox_id, None)
            if key is None:
                continue
            if key not in held:
                self._keys_in_flight.discard(key)
                continue
            waiting = held[key]
            self._released.append(waiting.popleft())  # its key stays in flight
            self.held_count -= 1
            if not waiting:
                del held[key]

    def unanswered(self, outbox_ids: Iterable[int]) -> None:
        """Events the broker did not take: no longer in flight, but their keys stay busy until a rewind."""
        for outbox_id in outbox_ids:
            self.in_flight.pop(outbox_id, None)

    def rewind(self) -> None:
        """Forget what was read but not sent: reading starts again at the oldest row of the outbox."""
        self._keys_in_flight = set(self.in_flight.values())
        self._held.clear()
        self.held_count = 0
        self._released.clear()
        self.read_upto = 0

    def forget(self) -> None:
        """Forget everything, what is in flight too (its producer was discarded)."""
        self.in_flight.clear()
        self.rewind()


class OutboxRelay:
    """One active relay at a time (the queue's lock); the others stand by and take over when it dies.

    Ordering per key does not depend on the producer: at most one event of a key is in flight at a time,
    so an event the broker did not take (an error, a timeout, an outage of any length) is sent again
    before anything newer of that key is handed to the producer: the later rows of a key wait here, in
    outbox order, until the one in flight is answered. Rows leave the outbox only once the
    broker acknowledged them (or rejected them for good); the events of a topic the broker does not have are
    handed back, as any the broker did not take, until the topic exists again. A relay that stops, fails or
    loses its lock first discards its producer, so nothing it handed out can land behind the next relay's
    events.

    Time is the `clock`'s monotonic seconds (the cadences of the heartbeat and the backlog, the grace period
    at stop); pauses are waits on the stop signal. A test that drives both runs the relay without sleeping.
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
        self._order = _KeyOrder()
        self._heartbeat = _Cadence(settings.heartbeat_every_s)
        self._backlog = _Cadence(settings.backlog_every_s)
        # Set while what the broker did not take waits for the rest in flight to be answered; then the relay
        # backs off (this is why) and reads again from the oldest row.
        self._retry_reason: str | None = None
        self._failures = 0  # in a row: the back-off grows with them
        self._wait = _Wait()

    @property
    def in_flight(self) -> int:
        """Events handed to the producer and not yet answered (a count another thread may read: tests wait on
        it)."""
        return len(self._order.in_flight)

    @property
    def held(self) -> int:
        """Rows read and waiting behind an earlier event of their key still in flight (a count another
        thread may read: tests wait on it)."""
        return self._order.held_count

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
                self._stand_down()
                self._back_off(stop, reason=type(exc).__name__)

    def step(self, stop: StopSignal) -> float | None:
        """Send a batch if there is room, settle the broker's answers; how long to pause before the next
        step when there is nothing to do (None while there is)."""
        role = self._queue.try_become_active()
        if role is RelayRole.STANDBY:
            self._wait.end()  # the active relay says what it waits for
            return self._settings.standby_wait_s
        if role is RelayRole.TAKEN_OVER:
            # No grace period: starting its producer fences the old relay's at the broker (the publisher's
            # transactional.id), so nothing the old one still holds can land after this one's first event.
            self._observer.took_over()
        self._publisher.start()  # before the first read: the producer gets its id while the relay reads
        sent = self._send_next_batch()
        self._keep_alive()  # after the batch went: the broker works on it meanwhile
        in_flight = self._order.in_flight
        waiting = not sent and in_flight  # for the broker's first answer, not for nothing
        self._settle(self._publisher.collect(self._settings.idle_wait_s if waiting else 0))
        if self._retry_reason is not None and not in_flight:
            reason, self._retry_reason = self._retry_reason, None
            self._order.rewind()  # what was to be tried again is read again, first of its key
            self._back_off(stop, reason=reason)
        if sent == 0 and not in_flight:
            self._wait_ended()
            return self._settings.idle_wait_s
        return None

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

    def _send_next_batch(self) -> int | None:
        """How many rows were sent; None when there was no room to look (so nothing is known to be idle)."""
        if self._retry_reason is not None:
            return None
        order, size = self._order, self._settings.batch_size
        looked = order.room(self._settings.max_in_flight) >= size
        ready = order.take_released()
        if looked:
            ready.extend(order.admit(self._queue.fetch_ready(size, order.read_upto)))
        self._dispatch(ready)
        return len(ready) if looked or ready else None

    def _dispatch(self, ready: list[PendingEvent]) -> None:
        """Hand rows to the producer (its at-once answers are settled like any others)."""
        if not ready:
            return
        self._order.sent(ready)
        self._wait.sent(self._clock.monotonic())
        self._settle(self._publisher.send(ready))

    def _settle(self, report: PublishReport) -> None:
        """Record the broker's answers; a held row whose key they free goes with the next batch."""
        if report.delivered or report.rejected:
            self._queue.settle(report.delivered, report.rejected)
            self._order.answered(report.delivered)
            self._order.answered(report.rejected)
        if report.delivered:
            self._wait.acknowledged(self._clock.monotonic(), more_waiting=bool(self._order.in_flight))
            self._observer.unacknowledged(0.0)  # a silence ends with the answer, not a beat later
        if report.delivered and self._retry_reason is None:
            if self._failures:
                self._observer.publishing_resumed()
            self._failures = 0
        if report.rejected:
            self._observer.dead_lettered(report.rejected)
        if report.retry:
            self._order.unanswered(report.retry)
            self._retry_reason = next(iter(report.retry.values()))
            self._observer.delivery_failed(report.retry)
        if report.topics_missing or report.topics_recreated or report.topics_found:
            self._topics_changed(report)

    def _topics_changed(self, report: PublishReport) -> None:
        """A topic of the relay's went missing (its events are held meanwhile), was recreated, or is back."""
        for topic, reason in report.topics_missing.items():
            self._observer.topic_missing(topic, reason)
        for topic in report.topics_recreated:
            self._observer.topic_recreated(topic)
        for topic in report.topics_found:
            self._observer.topic_found(topic)

    def _finish_in_flight(self) -> None:
        """On stop: give what is in flight a grace period; what stays unanswered is sent again later."""
        deadline = self._clock.monotonic() + self._settings.stop_grace_s
        while self._order.in_flight and self._clock.monotonic() < deadline:
            self._settle(self._publisher.collect(0.2))  # the held rows stay in the outbox for later

    def _stand_down(self) -> None:
        """Discard the producer (what it still holds stays in the outbox), then hand the lock over."""
        self._publisher.discard()
        self._order.forget()
        self._retry_reason = None
        self._heartbeat.make_due()
        self._queue.stand_down()

    def _back_off(self, stop: StopSignal, *, reason: str) -> None:
        self._failures += 1
        if self._failures >= _ASK_WHY_AFTER:
            self._observer.replicas_short(self._publisher.replication_shortfall())
        # the heartbeat's may not come
        self._observer.unacknowledged(self._wait.seconds(self._clock.monotonic()))
        delay = self._settings.backoff.delay(self._failures)
        self._observer.retrying(reason, self._failures, delay)
        stop.wait(delay)

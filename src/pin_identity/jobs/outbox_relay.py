"""The outbox relay: publishes committed outbox rows to Kafka and removes them once acknowledged."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pin_identity.jobs.ports import EventPublisher, OutboxQueue, PublishReport, StopSignal
from pin_identity.observability import metrics
from pin_identity.observability.logging import get_logger

log = get_logger("outbox-relay")


@dataclass(frozen=True)
class RelaySettings:
    batch_size: int = 2000
    # Batches handed to the producer before the first is acknowledged: fetching the next batch
    # overlaps the broker's work on the previous one.
    max_in_flight: int = 20_000
    idle_wait_s: float = 0.05
    standby_wait_s: float = 2.0
    max_backoff_s: float = 10.0
    stop_grace_s: float = 10.0
    backlog_every_s: float = 5.0


class OutboxRelay:
    """One active relay at a time (the queue's lock); the others stand by and take over when it dies.

    Rows leave the outbox only once the broker acknowledged them (or rejected them for good). When
    the broker asks for a retry, the relay stops sending, lets what is in flight settle, backs off,
    and starts again from the oldest row left, so the rows of one key keep their order.
    """

    def __init__(
        self, queue: OutboxQueue, publisher: EventPublisher, settings: RelaySettings = RelaySettings()
    ):
        self._queue = queue
        self._publisher = publisher
        self._settings = settings
        self._in_flight: set[int] = set()
        self._draining = False
        self._retry_reason = ""
        self._failures = 0
        self._backlog_due = 0.0

    def run(self, stop: StopSignal, *, once: bool = False) -> None:
        """Relay until stopped; with `once`, until the outbox holds nothing ready."""
        log.info("outbox-relay-started")
        try:
            self._loop(stop, once=once)
            self._finish_in_flight()
        finally:
            self._queue.reset()  # releases the relay lock at once, so a standby need not wait for a timeout
        log.info("outbox-relay-stopped")

    def _loop(self, stop: StopSignal, *, once: bool) -> None:
        while not stop.is_set():
            try:
                idle = self.step(stop)
            except Exception as exc:  # any failure: drop the session, back off, try again
                self._queue.reset()
                self._in_flight.clear()  # whatever the producer still holds is sent again: at-least-once
                self._back_off(stop, reason=type(exc).__name__)
                continue
            if once and idle:
                return

    def step(self, stop: StopSignal) -> bool:
        """Send a batch if there is room, settle the broker's answers; True when there is nothing to do."""
        if not self._queue.try_become_active():
            stop.wait(self._settings.standby_wait_s)
            return True
        self._report_backlog()
        sent = self._send_next_batch()
        self._settle(self._publisher.collect(0 if sent else self._settings.idle_wait_s))
        if self._draining and not self._in_flight:
            self._draining = False
            self._back_off(stop, reason=self._retry_reason)
        return sent == 0 and not self._in_flight

    def _report_backlog(self) -> None:
        if time.monotonic() < self._backlog_due:
            return
        self._backlog_due = time.monotonic() + self._settings.backlog_every_s
        waiting, oldest_age_s = self._queue.backlog()
        metrics.outbox_backlog.set(waiting)
        metrics.outbox_oldest_age_seconds.set(oldest_age_s)

    def _send_next_batch(self) -> int | None:
        """How many rows were sent; None when there was no room to look (so nothing is known to be idle)."""
        room = self._settings.max_in_flight - len(self._in_flight)
        if self._draining or room < self._settings.batch_size:
            return None
        ready = self._queue.fetch_ready(self._settings.batch_size, exclude=self._in_flight)
        if ready:
            self._in_flight.update(event.outbox_id for event in ready)
            self._settle(self._publisher.send(ready))
        return len(ready)

    def _settle(self, report: PublishReport) -> None:
        if report.delivered or report.rejected:
            self._queue.settle(report.delivered, report.rejected)
            self._in_flight.difference_update(report.delivered)
            self._in_flight.difference_update(report.rejected)
        if report.delivered and not self._draining:
            self._failures = 0
        if report.rejected:
            metrics.outbox_dead_letters_total.inc(len(report.rejected))
            for outbox_id, error in report.rejected.items():
                log.error("outbox-event-dead-lettered", outbox_id=outbox_id, error=error)
        if report.retry:
            self._in_flight.difference_update(report.retry)
            self._draining, self._retry_reason = True, next(iter(report.retry.values()))

    def _finish_in_flight(self) -> None:
        """On stop: give what is in flight a grace period; what stays unanswered is sent again later."""
        deadline = time.monotonic() + self._settings.stop_grace_s
        while self._in_flight and time.monotonic() < deadline:
            self._settle(self._publisher.collect(0.2))

    def _back_off(self, stop: StopSignal, *, reason: str) -> None:
        self._failures += 1
        delay = min(self._settings.max_backoff_s, 0.1 * 2 ** min(self._failures, 10))
        metrics.outbox_publish_errors_total.labels(reason=reason[:60]).inc()
        log.warning("outbox-relay-retrying", reason=reason, attempt=self._failures, delay_s=round(delay, 2))
        stop.wait(delay)

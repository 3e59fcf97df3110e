"""The outbox relay: publishes committed outbox rows to Kafka and removes them once acknowledged."""

from __future__ import annotations

from dataclasses import dataclass

from pin_identity.jobs.ports import EventPublisher, OutboxQueue, PublishReport, StopSignal
from pin_identity.observability import metrics
from pin_identity.observability.logging import get_logger

log = get_logger("outbox-relay")


@dataclass(frozen=True)
class RelaySettings:
    batch_size: int = 5000
    idle_wait_s: float = 0.05
    standby_wait_s: float = 2.0
    max_backoff_s: float = 10.0


class OutboxRelay:
    """One active relay at a time (the queue's lock); the others stand by and take over when it dies."""

    def __init__(
        self, queue: OutboxQueue, publisher: EventPublisher, settings: RelaySettings = RelaySettings()
    ):
        self._queue = queue
        self._publisher = publisher
        self._settings = settings
        self._failures = 0

    def run(self, stop: StopSignal, *, once: bool = False) -> None:
        """Relay until stopped; with `once`, until the outbox holds nothing ready."""
        log.info("outbox-relay-started")
        try:
            self._loop(stop, once=once)
        finally:
            self._queue.reset()  # releases the relay lock at once, so a standby need not wait for a timeout
        log.info("outbox-relay-stopped")

    def _loop(self, stop: StopSignal, *, once: bool) -> None:
        while not stop.is_set():
            try:
                progressed = self.relay_batch(stop)
            except Exception as exc:  # any failure: drop the session, back off, try again
                self._queue.reset()
                self._back_off(stop, reason=type(exc).__name__)
                continue
            if once and progressed == 0:
                break
            if progressed == 0:
                stop.wait(self._settings.idle_wait_s)

    def relay_batch(self, stop: StopSignal) -> int:
        """Publish one batch; returns how many rows left the outbox (0: nothing ready or standing by)."""
        if not self._queue.try_become_active():
            stop.wait(self._settings.standby_wait_s)
            return 0
        ready = self._queue.fetch_ready(self._settings.batch_size)
        if not ready:
            return 0
        report = self._publisher.publish(ready, stop.is_set)
        self._queue.settle(report.delivered, report.rejected)
        self._record(report, ready_count=len(ready))
        if report.retry:
            self._back_off(stop, reason=next(iter(report.retry.values())))
        else:
            self._failures = 0
        return len(report.delivered) + len(report.rejected)

    def _record(self, report: PublishReport, *, ready_count: int) -> None:
        if report.rejected:
            metrics.outbox_dead_letters_total.inc(len(report.rejected))
            for outbox_id, error in report.rejected.items():
                log.error("outbox-event-dead-lettered", outbox_id=outbox_id, error=error)
        if report.delivered:
            log.debug("outbox-batch-published", published=len(report.delivered), fetched=ready_count)

    def _back_off(self, stop: StopSignal, *, reason: str) -> None:
        self._failures += 1
        delay = min(self._settings.max_backoff_s, 0.1 * 2 ** min(self._failures, 10))
        metrics.outbox_publish_errors_total.labels(reason=reason[:60]).inc()
        log.warning("outbox-relay-retrying", reason=reason, attempt=self._failures, delay_s=round(delay, 2))
        stop.wait(delay)

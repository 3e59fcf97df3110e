"""What the outbox relay tells operators: its log lines (stable `event` names) and its metrics, in one place.

The relay calls one hook per thing that happened; tests subclass the observer to wait on those hooks as
signals instead of polling or sleeping.
"""

from __future__ import annotations

from collections.abc import Mapping

from pin_identity.observability import metrics
from pin_identity.observability.logging import get_logger

log = get_logger("outbox-relay")


class RelayObserver:
    def started(self) -> None:
        log.info("outbox-relay-started")

    def stopped(self) -> None:
        log.info("outbox-relay-stopped")

    def took_over(self, grace_s: float) -> None:
        """The lock came from a relay that did not stand down cleanly: this one waits `grace_s` first."""
        log.warning("outbox-relay-took-over", grace_s=grace_s)

    def backlog(self, waiting: int, oldest_age_s: float) -> None:
        metrics.record_outbox_backlog(waiting, oldest_age_s)

    def dead_lettered(self, rejected: Mapping[int, str]) -> None:
        """The broker refused these events for good (outbox id -> error): they left the outbox."""
        metrics.outbox_dead_letters_total.inc(len(rejected))
        for outbox_id, error in rejected.items():
            log.error("outbox-event-dead-lettered", outbox_id=outbox_id, error=error)

    def delivery_failed(self, retry: Mapping[int, str]) -> None:
        """The broker did not take these events (outbox id -> reason: an error, a timeout). Once nothing else
        is in flight the relay backs off (`retrying`) and sends them again, each first of its key."""

    def failed(self, exc: Exception) -> None:
        """Anything else went wrong: the relay stands down (its producer discarded) and backs off."""
        log.warning("outbox-relay-failed", error=type(exc).__name__)

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        metrics.outbox_publish_errors_total.labels(reason=reason[:60]).inc()
        log.warning("outbox-relay-retrying", reason=reason, attempt=attempt, delay_s=round(delay_s, 2))

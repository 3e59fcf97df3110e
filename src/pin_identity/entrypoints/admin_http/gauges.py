"""The gauges `serve` reads from the database (the use case QueueGaugeReads), for `/metrics` and for the
console's health summary, which shows the very figures read (QueueGauges), not the registry's copy of them.

They are read at most once per MAX_AGE_S whatever the number of scrapes, so `/metrics` (no authentication)
cannot be used to load the database; a scrape never waits for another's read (the registry keeps the last
figures meanwhile), so a flood of scrapes holds at most one worker thread on the database. This is a
deliberate deviation from CONTRACTS section 6's "computed at scrape time" (docs/operators.md, "Admin HTTP API:
choices").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from contextlib import suppress

import psycopg
from psycopg_pool import PoolTimeout

from pin_identity.composition import Container
from pin_identity.config import ConfigurationError
from pin_identity.domain.clock import Clock
from pin_identity.entrypoints.admin_http.problems import DatabaseUnavailableError
from pin_identity.observability import metrics
from pin_identity.observability.logging import describe_error, get_logger
from pin_identity.operations.health_reads import QueueGauges

log = get_logger("admin-http")

MAX_AGE_S = 5.0  # a Prometheus scrape interval is 15-60 s: each scrape still sees figures of its own


def _nothing_to_close() -> None:
    return None


class DatabaseGauges:
    """The database gauges, read at most once per `max_age_s` (a read that failed too: the database is not
    asked again by every scrape while it is down); one read at a time."""

    def __init__(
        self,
        read: Callable[[], QueueGauges],
        *,
        close: Callable[[], None] = _nothing_to_close,
        max_age_s: float = MAX_AGE_S,
        clock: Clock,
    ):
        self._read, self._close, self._max_age_s, self._clock = read, close, max_age_s, clock
        self._lock = threading.Lock()
        self._last: QueueGauges | None = None  # None after a read that failed
        self._read_at = -math.inf

    @classmethod
    def of(cls, container: Container) -> DatabaseGauges:
        reads = container.use_cases.queue_gauges()
        return cls(reads.read, close=reads.close, clock=container.clock)

    def refresh(self) -> None:
        """For a scrape: the registry's gauges brought up to date if they are older than `max_age_s`. While
        another caller reads, returns at once: the registry keeps the last figures."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            with suppress(DatabaseUnavailableError):  # the registry keeps its last values; the log said why
                self._current()
        finally:
            self._lock.release()

    def read(self) -> QueueGauges:
        """The gauges at most `max_age_s` old, waiting for a read under way; DatabaseUnavailableError when
        the last read failed: stale figures must not pass for the present."""
        with self._lock:
            return self._current()

    def _current(self) -> QueueGauges:
        if self._clock.monotonic() - self._read_at >= self._max_age_s:
            self._last = self._fresh()
            self._read_at = self._clock.monotonic()
        if self._last is None:
            raise DatabaseUnavailableError
        return self._last

    def _fresh(self) -> QueueGauges | None:
        """The gauges read now, also set in the registry; None when the database did not answer."""
        try:
            gauges = self._read()
        except (psycopg.Error, PoolTimeout, ConfigurationError) as exc:
            log.warning("metrics-refresh-failed", error=describe_error(exc))
            return None
        metrics.record_outbox_backlog(gauges.outbox_backlog, gauges.outbox_oldest_age_s, gauges.outbox_held_s)
        metrics.record_fanout_queue(gauges.fanout_backlog, gauges.fanout_failed)
        metrics.record_import_running(gauges.import_started_at)
        counters = gauges.import_counters
        metrics.record_import_progress(
            {aggregate: count.planned for aggregate, count in counters.items()},
            {
                aggregate: count.applied + count.skipped + count.failed
                for aggregate, count in counters.items()
            },
        )
        return gauges

    def close(self) -> None:
        with self._lock:
            self._close()

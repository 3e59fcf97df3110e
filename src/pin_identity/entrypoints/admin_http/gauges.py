"""The gauges `serve` reads from the database: at each scrape of `/metrics`, and for the console's health
summary, which shows the very figures read (QueueGauges), not the registry's copy of them."""

from __future__ import annotations

import threading

import psycopg
from psycopg_pool import PoolTimeout

from pin_identity.composition import Container
from pin_identity.config import ConfigurationError
from pin_identity.domain.events import now_utc
from pin_identity.entrypoints.admin_http.problems import DatabaseUnavailableError
from pin_identity.observability import metrics
from pin_identity.observability.logging import describe_error, get_logger
from pin_identity.operations.ports.outbox import OutboxBacklog, OutboxBacklogSession
from pin_identity.operations.read_models import QueueGauges

log = get_logger("admin-http")


class DatabaseGauges:
    """The gauges read from the database, refreshed at scrape time. The outbox backlog comes from the
    outbox queue's own query, on one dedicated session kept for the process."""

    def __init__(self, container: Container):
        self._container = container
        self._outbox: OutboxBacklogSession | None = None
        self._lock = threading.Lock()

    def _outbox_backlog(self) -> OutboxBacklog:
        with self._lock:
            if self._outbox is None:
                self._outbox = self._container.outbox_backlog_reader()
            try:
                return self._outbox.backlog()
            except psycopg.Error:
                self._outbox.reset()  # reconnect at the next scrape
                raise

    def _ask(self) -> QueueGauges:
        outbox = self._outbox_backlog()
        stats = self._container.fanout_queue.stats(now_utc())
        running = self._container.import_store.running_run()
        return QueueGauges(
            outbox_backlog=outbox.waiting,
            outbox_oldest_age_s=outbox.oldest_age_s,
            outbox_held_s=outbox.held_s,
            outbox_held_by=outbox.held_by,
            fanout_backlog=stats.backlog,
            fanout_failed=stats.failed,
            import_started_at=running.started_at if running else None,
        )

    def read(self) -> QueueGauges:
        """The gauges now, also set in the registry; DatabaseUnavailableError when the database did not
        answer: the registry keeps its last values (a scrape still answers, and the log says why)."""
        try:
            gauges = self._ask()
        except (psycopg.Error, PoolTimeout, ConfigurationError) as exc:
            log.warning("metrics-refresh-failed", error=describe_error(exc))
            raise DatabaseUnavailableError from None
        metrics.record_outbox_backlog(gauges.outbox_backlog, gauges.outbox_oldest_age_s, gauges.outbox_held_s)
        metrics.record_fanout_queue(gauges.fanout_backlog, gauges.fanout_failed)
        metrics.record_import_running(gauges.import_started_at)
        return gauges

    def close(self) -> None:
        with self._lock:
            if self._outbox is not None:
                self._outbox.reset()
                self._outbox = None

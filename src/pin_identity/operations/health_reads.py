"""The console's health summary: the database gauges `/metrics` serves (QueueGaugeReads; the caller hands
them over a few seconds old at most), the outbox's dead letters, and how far the talent-sync consumer group is
behind on Talent's topics. Only a worker running talent-sync has the lag as a gauge; any other process asks
the broker."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import BrokerUnavailableError
from pin_identity.domain.import_run import StageCounters
from pin_identity.operations.documents import ConsumerLag, HealthSummary, PublishingHolderView
from pin_identity.operations.ports.fanout_tasks import FanOutQueue
from pin_identity.operations.ports.health_sources import ConsumerLagReader, DeadLetterReads, DeadLetters
from pin_identity.operations.ports.import_records import ImportRunRecords
from pin_identity.operations.ports.outbox import OutboxBacklogSession, PublishingHolder


@dataclass(frozen=True)
class QueueGauges:
    """The gauges `/metrics` reads from the database for scrapes (at most every few seconds), read at one
    moment."""

    outbox_backlog: int  # rows not yet acknowledged
    outbox_oldest_age_s: float
    outbox_held_s: float  # how long the oldest running writer's transaction has run: publishing waits on it
    outbox_held_by: PublishingHolder | None
    fanout_backlog: int
    fanout_failed: int
    import_started_at: datetime | None  # of the Running import run; None when none runs
    # The Running run's counters by aggregate (`company`, `user`); empty when none runs.
    import_counters: Mapping[str, StageCounters] = field(default_factory=dict)


class QueueGaugeReads:
    """The reads behind the gauges: the outbox backlog with the outbox queue's own query, on one dedicated
    session kept for as long as this reader (opened at the first read, again after a read that failed); the
    fan-out queue's stats and the Running import run on the pool. The stores are reached at the first read,
    so that making the reader (with the admin API) asks the database nothing."""

    def __init__(
        self,
        open_outbox: Callable[[], OutboxBacklogSession],
        fanout_queue: Callable[[], FanOutQueue],
        import_runs: Callable[[], ImportRunRecords],
        clock: Clock,
    ):
        self._open_outbox, self._fanout_queue, self._import_runs = open_outbox, fanout_queue, import_runs
        self._clock = clock
        self._outbox: OutboxBacklogSession | None = None

    def read(self) -> QueueGauges:
        if self._outbox is None:
            self._outbox = self._open_outbox()
        try:
            outbox = self._outbox.backlog()
        except Exception:
            self.close()  # a session that failed is not asked again: the next read opens another
            raise
        stats = self._fanout_queue().stats(self._clock.now())
        running = self._import_runs().running_run()
        counters = {"company": running.companies, "user": running.users} if running else {}
        return QueueGauges(
            outbox_backlog=outbox.waiting,
            outbox_oldest_age_s=outbox.oldest_age_s,
            outbox_held_s=outbox.held_s,
            outbox_held_by=outbox.held_by,
            fanout_backlog=stats.backlog,
            fanout_failed=stats.failed,
            import_started_at=running.started_at if running else None,
            import_counters=counters,
        )

    def close(self) -> None:
        if self._outbox is not None:
            self._outbox.reset()
            self._outbox = None


class HealthReads:
    def __init__(
        self, dead_letters: DeadLetterReads, lags: ConsumerLagReader, group: str, topics: Sequence[str]
    ):
        self._dead_letters, self._lags = dead_letters, lags
        self._group, self._topics = group, tuple(topics)

    def dead_letters(self) -> DeadLetters:
        return self._dead_letters.dead_letters()

    def consumer_lag(self) -> ConsumerLag:
        """The group's lag, or why the broker did not say: an unanswered broker is part of the health
        summary, not a failure of it."""
        try:
            partitions = self._lags.partition_lags(self._group, self._topics)
        except BrokerUnavailableError as exc:
            return ConsumerLag.unknown(self._group, str(exc))
        return ConsumerLag.measured(self._group, partitions)

    def report(self, queues: QueueGauges, read_at: datetime) -> HealthSummary:
        """The whole summary around the gauges just read."""
        return _summary(queues, self.dead_letters(), self.consumer_lag(), read_at)


def _summary(
    queues: QueueGauges, dead: DeadLetters, consumer_lag: ConsumerLag, read_at: datetime
) -> HealthSummary:
    held_by = queues.outbox_held_by
    return HealthSummary(
        outbox_backlog=queues.outbox_backlog,
        outbox_oldest_age_seconds=queues.outbox_oldest_age_s,
        outbox_publishing_held_seconds=queues.outbox_held_s,
        outbox_held_by=_holder_view(held_by) if held_by else None,
        fanout_backlog=queues.fanout_backlog,
        fanout_failed=queues.fanout_failed,
        import_running=queues.import_started_at is not None,
        dead_letters=dead.count,
        newest_dead_letter_at=dead.newest_failed_at,
        consumer_lag=consumer_lag,
        read_at=read_at,
    )


def _holder_view(holder: PublishingHolder) -> PublishingHolderView:
    return PublishingHolderView(
        pid=holder.pid,
        application_name=holder.application_name,
        transaction_seconds=holder.transaction_s,
        prepared_gid=holder.prepared_gid,
    )

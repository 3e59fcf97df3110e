"""What the continuous consumer tells operators: its log lines (stable `event` names) and its metrics, in one
place.

The job calls one hook per thing that happened; tests subclass the observer to wait on those hooks as signals
instead of polling or sleeping.
"""

from __future__ import annotations

from collections.abc import Mapping

from pin_identity.jobs.replica_outcomes import record_outcome
from pin_identity.observability import metrics
from pin_identity.observability.logging import describe_error, get_logger
from pin_identity.operations.talent_replica import BatchOutcome

log = get_logger("talent-sync")

# A partition that reads nothing this long while records wait on it is said to stall (a healthy one moves
# with every batch); a lost leader's partitions stall until the cluster declares the broker dead (9 s).
STALL_WARNING_S = 5.0


class TalentSyncObserver:
    # The partitions whose lag this process reported: one moved to another member is removed from the gauge,
    # not left at its last value (a sum over the group's workers would count it twice).
    _reported: frozenset[tuple[str, int]] = frozenset()
    _aged: frozenset[tuple[str, int]] = frozenset()  # the same for the lag's age
    # Why the last offset commit failed, until the group's coordinator answers again (a commit, or a read of
    # the committed offsets for the lag): `/readyz` reads it from another thread.
    _commit_failing: str | None = None
    # How long a partition with records left has read nothing, once that reached STALL_WARNING_S (`/readyz`).
    _stalled_s: float | None = None

    def started(self, batch_size: int) -> None:
        log.info("talent-sync-started", batch_size=batch_size)

    def stopped(self) -> None:
        log.info("talent-sync-stopped")

    def lag_measured(self, lag: Mapping[tuple[str, int], int]) -> None:
        """How far the group's committed offset of each partition assigned here is behind its end (0:
        caught up); partitions no longer assigned here leave the gauge. The committed offsets came from the
        group's coordinator: it answers."""
        self.coordinator_answers()
        for topic, partition in self._reported - lag.keys():
            metrics.talent_sync_consumer_lag.remove(topic, str(partition))
        for (topic, partition), behind in lag.items():
            metrics.talent_sync_consumer_lag.labels(topic=topic, partition=str(partition)).set(behind)
        self._reported = frozenset(lag)

    def lag_age_measured(self, ages: Mapping[tuple[str, int], float]) -> None:
        """How old the oldest unapplied record of each partition assigned here is (0: caught up); partitions
        no longer assigned here leave the gauge."""
        for topic, partition in self._aged - ages.keys():
            metrics.talent_sync_consumer_lag_seconds.remove(topic, str(partition))
        for (topic, partition), age in ages.items():
            metrics.talent_sync_consumer_lag_seconds.labels(topic=topic, partition=str(partition)).set(age)
        self._aged = frozenset(ages)

    def lag_age_unknown(self, exc: Exception) -> None:
        """The first unapplied records could not be read: the age gauge keeps its last value until the next
        report."""
        log.warning("talent-sync-lag-age-unknown", error=describe_error(exc))

    def batch_applied(self, records: int, batch: BatchOutcome) -> None:
        """A polled batch committed to the replica (its offsets are committed or tried)."""
        _record(batch)
        log.info(
            "talent-sync-batch-applied",
            records=records,
            applied=batch.applied,
            skipped=batch.skipped,
            failed=batch.failed,
        )

    def coordinator_answers(self) -> None:
        """An offset commit succeeded, or the committed offsets were read: a warning of offsets not committed
        ends (an idle stream commits nothing, and must not warn for ever of its last failed commit)."""
        if self._commit_failing is not None:
            self._commit_failing = None
            log.info("talent-sync-coordinator-answers")

    def offsets_recommitted(self, partitions: int) -> None:
        """The periodic check of the committed offsets answered; `partitions` were behind what was applied
        and are committed now."""
        if partitions:
            log.info("talent-sync-offsets-recommitted", partitions=partitions)
        self.coordinator_answers()

    def offset_commit_failed(self, exc: Exception) -> None:
        """The group's coordinator did not take a batch's offsets (its node lost, the coordinator moving, a
        rebalance): consuming goes on, and a restart would read the batch again. On `/readyz` until the
        coordinator answers."""
        metrics.talent_sync_offset_commit_failures_total.inc()
        self._commit_failing = describe_error(exc)
        log.warning("talent-sync-offset-commit-failed", error=self._commit_failing)

    def stall_measured(self, seconds: float) -> None:
        """How long the longest-stalled partition (records left, none read) has read nothing: said once it
        reaches STALL_WARNING_S, and once it moves again."""
        metrics.talent_sync_stalled_seconds.set(seconds)
        if seconds >= STALL_WARNING_S:
            if self._stalled_s is None:
                log.warning("talent-sync-stalled", seconds=round(seconds, 1))
            self._stalled_s = seconds
        elif self._stalled_s is not None:
            log.info("talent-sync-flowing", stalled_s=round(self._stalled_s, 1))
            self._stalled_s = None

    def readiness_warning(self) -> str | None:
        failing, stalled_s = self._commit_failing, self._stalled_s
        said = [f"talent-sync cannot commit its offsets: {failing}"] if failing else []
        if stalled_s is not None:
            said.append(
                f"talent-sync has read nothing for {stalled_s:.0f} s of a partition with records left"
            )
        return "; ".join(said) or None

    def batch_failed(self, exc: Exception, failures: int) -> None:
        """A polled batch rolled back: it is read again after a back-off."""
        log.warning("talent-sync-batch-failed", error=describe_error(exc), failures=failures)

    def deferred_retried(self, items: int, batch: BatchOutcome) -> None:
        _record(batch)
        log.info("talent-sync-deferred-retried", items=items)

    def retry_failed(self, exc: Exception) -> None:
        log.warning("talent-sync-retry-failed", error=describe_error(exc))


def _record(batch: BatchOutcome) -> None:
    for outcome in batch.outcomes:
        record_outcome(outcome, metric=metrics.talent_sync_items_total, correlation_id=batch.correlation_id)

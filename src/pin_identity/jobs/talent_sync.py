"""`worker --jobs talent-sync`: the continuous consumer of Talent's tenant and user topics.

A polled batch is applied in one database transaction (tenants before users), and only after that commit are
the batch's offsets committed: a crash in between replays the batch, which the version guard makes harmless.
A user whose tenant has not arrived yet is parked in the quarantine with a next-attempt time and retried with
backoff, so it is neither lost nor holding up its partition.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from pin_identity.config import TalentSyncSettings
from pin_identity.domain.clock import Clock
from pin_identity.jobs.talent_sync_observer import TalentSyncObserver
from pin_identity.observability.tracing import current_traceparent, traced, tracer
from pin_identity.operations.context import Context
from pin_identity.operations.ports.job_control import StopSignal
from pin_identity.operations.ports.replica import ReplicaTransactions, SourceItem
from pin_identity.operations.ports.talent_sources import TalentRecord, TalentStream
from pin_identity.operations.talent_replica import ApplyOptions, BatchOutcome, apply_snapshots, retry_due

_LAG_REPORT_S = 10.0

_tracer = tracer("talent-sync")


class TalentSyncJob:
    def __init__(
        self,
        stream: TalentStream,
        transactions: ReplicaTransactions,
        settings: TalentSyncSettings,
        *,
        clock: Clock,
        observer: TalentSyncObserver | None = None,
    ):
        self._stream, self._transactions, self._settings, self._clock = stream, transactions, settings, clock
        self._observer = observer or TalentSyncObserver()
        self._failures = 0
        self._stalls = _PartitionStalls()

    def run(self, stop: StopSignal, *, once: bool = False) -> None:
        """With `once`: until every assigned partition is read to its end and no deferred item is due."""
        self._observer.started(self._settings.batch_size)
        next_lag_report = 0.0
        try:
            while not stop.is_set():
                busy = self.step()
                # the lag gauge, also when nobody asks for `once`
                if self._clock.monotonic() >= next_lag_report:
                    self._recommit()
                    self.report_lag()
                    next_lag_report = self._clock.monotonic() + _LAG_REPORT_S
                if self._failures:
                    stop.wait(self._settings.error_backoff.delay(self._failures))
                elif once and not busy and self._caught_up():
                    break
        finally:
            self._stream.close()
            self._observer.stopped()

    def step(self) -> bool:
        """One poll (and whether its partitions move) and one round of due retries; True when there was
        something to do."""
        records = self._stream.poll(self._settings.batch_size, self._settings.poll_timeout_s)
        consumed = self._consume(records) if records else self._commit_ends()
        self._observer.stall_measured(self._stalls.longest(self._stream.positions(), self._clock.now()))
        retried = self._retry_deferred()
        return consumed or retried

    def _recommit(self) -> None:
        try:
            partitions = self._stream.recommit()
        except Exception as exc:  # the coordinator still away: the next report tries again
            self._observer.offset_commit_failed(exc)
        else:
            if partitions is not None:
                self._observer.offsets_recommitted(partitions)

    def report_lag(self) -> None:
        """The lag in records and in time (the spec's SLO: under 5 minutes after the handover): per assigned
        partition, how old the first record not applied yet is, from its timestamp (0 when caught up)."""
        lag = self._stream.lag()
        if lag is None:
            return
        self._observer.lag_measured(lag)
        behind = {where: left for where, left in lag.items() if left > 0}
        try:
            since = self._stream.unapplied_since(behind) if behind else {}
        except Exception as exc:  # the age waits for the next report; consuming goes on
            self._observer.lag_age_unknown(exc)
            return
        now = self._clock.now()
        ages = {where: (now - since[where]).total_seconds() if where in since else 0.0 for where in lag}
        self._observer.lag_age_measured({where: max(age, 0.0) for where, age in ages.items()})

    def _caught_up(self) -> bool:
        lag = self._stream.lag()
        if lag is None:
            return False
        self._observer.lag_measured(lag)
        return all(behind == 0 for behind in lag.values())

    def _consume(self, records: list[TalentRecord]) -> bool:
        batch = self._apply([SourceItem(record.item) for record in records])
        if batch is None:
            self._stream.rewind(records)
            return False
        try:
            self._stream.commit(records)
        except Exception as exc:  # the batch is applied; a replay would be skipped by the version guard
            self._observer.offset_commit_failed(exc)
        else:
            self._observer.coordinator_answers()
        self._observer.batch_applied(len(records), batch)
        return True

    def _commit_ends(self) -> bool:
        """A poll without records may still have read a partition to its end (past a commit marker)."""
        try:
            self._stream.commit([])
        except (
            Exception
        ) as exc:  # as a batch's commit: the next one, or the lag report's recommit, carries it
            self._observer.offset_commit_failed(exc)
        return False

    def _retry_deferred(self) -> bool:
        try:
            with self._transactions() as tx:
                ctx = Context(correlation_id=uuid.uuid4(), now=self._clock.now())
                due = tx.due_quarantined(ctx.now, self._settings.batch_size)
                if not due:
                    return False
                with traced(_tracer, "talent-sync.retry-deferred", {"items": len(due)}):
                    ctx = replace(ctx, traceparent=current_traceparent())
                    batch = retry_due(tx, due, ctx, self._options(ctx.now))
                    tx.commit()
        except Exception as exc:
            self._observer.retry_failed(exc)
            return False
        self._observer.deferred_retried(len(batch.outcomes), batch)
        return True

    def _apply(self, items: list[SourceItem]) -> BatchOutcome | None:
        """One transaction (the batch's tenants before its users); None when it rolled back. Its events carry
        the batch's span's traceparent."""
        correlation_id = uuid.uuid4()
        attributes: dict[str, str | int] = {"records": len(items), "correlationId": str(correlation_id)}
        try:
            with traced(_tracer, "talent-sync.apply", attributes) as span, self._transactions() as tx:
                ctx = Context(correlation_id, self._clock.now(), traceparent=current_traceparent())
                batch = apply_snapshots(tx, items, ctx, self._options(ctx.now))
                tx.commit()
                span.set_attribute("itemsApplied", batch.applied)
                span.set_attribute("itemsSkipped", batch.skipped)
                span.set_attribute("itemsFailed", batch.failed)
        except Exception as exc:
            self._failures += 1
            self._observer.batch_failed(exc, self._failures)
            return None
        self._failures = 0
        return batch

    def _options(self, now: datetime) -> ApplyOptions:
        settings = self._settings

        def retry_at(attempt: int) -> datetime | None:
            if attempt > settings.max_deferrals:
                return None
            return now + timedelta(seconds=settings.retry_backoff.delay(attempt))

        return ApplyOptions(run_id=None, retry_at=retry_at)


class _PartitionStalls:
    """Since when each assigned partition with records left to read has not moved: one whose leader was
    lost and is not replaced yet reads nothing while the others go on (a broker is declared dead only after
    its session times out, 9 s by default), so a stall shows per partition, not in the batches."""

    def __init__(self) -> None:
        self._still: dict[tuple[str, int], tuple[int, datetime]] = {}

    def longest(self, positions: Mapping[tuple[str, int], tuple[int, int]], now: datetime) -> float:
        """Seconds the longest-stalled partition has not moved; 0 when every one moves or has read all."""
        still = {}
        for where, (offset, left) in positions.items():
            seen = self._still.get(where)
            still[where] = (offset, seen[1] if seen is not None and seen[0] == offset and left > 0 else now)
        self._still = still
        return max(((now - since).total_seconds() for _, since in still.values()), default=0.0)

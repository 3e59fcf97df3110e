"""AccessFanOutJob: a role's permission set changed, so every user holding it hears UserAccessChanged.

One leased task at a time per worker; pages of the role's users by UserId; each page's events and the
task's checkpoint commit together, and the outbox relay publishes them after commit.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from pin_identity.domain import events
from pin_identity.domain.backoff import Backoff
from pin_identity.domain.model import AccessChangeReason
from pin_identity.jobs.ports import FanOutQueue, FanOutTask, LeaseLostError, StopSignal, TaskWakeups
from pin_identity.observability import metrics
from pin_identity.observability.logging import describe_error, get_logger
from pin_identity.observability.tracing import current_traceparent, tracer

log = get_logger("access-fanout")
_tracer = tracer("access-fanout")

Clock = Callable[[], datetime]


@dataclass(frozen=True)
class FanOutSettings:
    """PollingInterval, BatchSize, MaxLeaseDuration, MaxAttempts (CONTRACTS section 1)."""

    polling_interval_s: float = 5.0
    batch_size: int = 500
    max_lease_s: float = 300.0
    max_attempts: int = 5

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.max_lease_s)

    def retry_delay(self, attempt: int) -> timedelta:
        """After a failed attempt the task waits a little (2 s, doubling), never longer than a lease."""
        return timedelta(seconds=Backoff(base_s=2.0, cap_s=self.max_lease_s).delay(attempt))


class TaskOutcome(StrEnum):
    COMPLETED = "completed"
    STOPPED = "stopped"
    LEASE_LOST = "lease_lost"
    ERROR = "error"


class AccessFanOutJob:
    def __init__(self, queue: FanOutQueue, wakeups: TaskWakeups, settings: FanOutSettings, clock: Clock):
        self._queue = queue
        self._wakeups = wakeups
        self._settings = settings
        self._clock = clock

    def run(self, stop: StopSignal, *, once: bool = False) -> None:
        """Take tasks until stopped; with `once`, until no task is claimable."""
        log.info("fanout-job-started", batch_size=self._settings.batch_size)
        try:
            while not stop.is_set():
                if self.step(stop):
                    continue
                if once:
                    break
                self._await_task(stop)
        finally:
            self._wakeups.close()

    def step(self, stop: StopSignal) -> bool:
        """Claim and process one task; True when a task was taken."""
        try:
            task = self._claim()
        except Exception as exc:  # the database is away: the caller waits a polling interval
            metrics.fanout_errors_total.inc()
            log.warning("fanout-claim-failed", error=type(exc).__name__)
            return False
        if task is None:
            return False
        self.process(task, stop)
        return True

    def _await_task(self, stop: StopSignal) -> None:
        """Until a task is announced or PollingInterval passes (the fallback), checking for a stop."""
        deadline = time.monotonic() + self._settings.polling_interval_s
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if self._wakeups.wait(min(left, 0.5)):
                return

    def _claim(self) -> FanOutTask | None:
        now = self._clock()
        for poisoned in self._queue.fail_exhausted(now, self._settings.max_attempts):
            metrics.fanout_tasks_total.labels(result="failed").inc()
            log.error(
                "fanout-task-failed",
                task_id=str(poisoned.task_id),
                role_id=str(poisoned.role_id),
                attempt=poisoned.attempts,
                final=True,
                exception=poisoned.last_error,
            )
        stats = self._queue.stats(now)
        metrics.fanout_queue_backlog.set(stats.backlog)
        metrics.fanout_failed_tasks.set(stats.failed)
        return self._queue.claim(uuid.uuid4(), now, now + self._settings.lease)

    def process(self, task: FanOutTask, stop: StopSignal) -> TaskOutcome:
        """Pages until the role is done, the lease is lost, the worker stops, or a batch fails."""
        log.info(
            "fanout-task-dequeued",
            task_id=str(task.task_id),
            role_id=str(task.role_id),
            attempt=task.attempt,
            job_run_id=str(task.claim_id),
        )
        started = time.monotonic()
        attributes = {
            "jobRunId": str(task.claim_id),
            "taskId": str(task.task_id),
            "roleId": str(task.role_id),
        }
        with _tracer.start_as_current_span("access-fanout.task", attributes=attributes) as span:
            outcome = self._pages(task, stop)
            span.set_attribute("outcome", outcome.value)
        if outcome == TaskOutcome.COMPLETED:
            metrics.observe_fanout_task_duration(time.monotonic() - started)
        return outcome

    def _pages(self, task: FanOutTask, stop: StopSignal) -> TaskOutcome:
        cursor, processed = task.cursor, task.processed_count
        while True:
            if stop.is_set():
                self._release(task, count_attempt=False, error=None)
                return TaskOutcome.STOPPED
            try:
                page_size, cursor = self._batch(task, cursor)
            except LeaseLostError:
                log.warning("fanout-lease-lost", task_id=str(task.task_id), job_run_id=str(task.claim_id))
                return TaskOutcome.LEASE_LOST
            except Exception as exc:
                self._fail_attempt(task, exc)
                return TaskOutcome.ERROR
            processed += page_size
            if page_size < self._settings.batch_size:
                self._completed(task, processed)
                return TaskOutcome.COMPLETED

    def _batch(self, task: FanOutTask, cursor: uuid.UUID | None) -> tuple[int, uuid.UUID | None]:
        """One page in one transaction: its events and the advanced checkpoint, or nothing at all."""
        size = self._settings.batch_size
        now = self._clock()
        with (
            _tracer.start_as_current_span("access-fanout.batch", attributes={"batchSize": size}) as span,
            self._queue.batch(task, now, now + self._settings.lease) as batch,
        ):
            snapshots = batch.page(task.role_id, cursor, size)
            batch.add_events(
                events.rendered_access_changed(
                    snapshots,
                    reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
                    version=task.role_version,
                    changed_role_id=task.role_id,
                    correlation_id=task.claim_id,
                    occurred_at=now,
                    traceparent=current_traceparent(),
                )
            )
            next_cursor = snapshots[-1].user_id if snapshots else cursor
            batch.advance(cursor=next_cursor, processed=len(snapshots), completed=len(snapshots) < size)
            batch.commit()
            span.set_attribute("processedCount", len(snapshots))
        metrics.fanout_batches_total.inc()
        metrics.fanout_users_total.inc(len(snapshots))
        log.info(
            "fanout-batch-processed",
            role_id=str(task.role_id),
            rows=len(snapshots),
            cursor=str(next_cursor) if next_cursor else None,
            job_run_id=str(task.claim_id),
        )
        return len(snapshots), next_cursor

    def _completed(self, task: FanOutTask, processed: int) -> None:
        lag = (self._clock() - task.created_at).total_seconds()
        metrics.fanout_tasks_total.labels(result="completed").inc()
        metrics.fanout_task_lag_seconds.observe(max(lag, 0.0))
        metrics.fanout_size.observe(processed)
        metrics.fanout_last_success.set(time.time())
        log.info(
            "fanout-task-completed",
            task_id=str(task.task_id),
            role_id=str(task.role_id),
            processed_count=processed,
            lag_s=round(lag, 3),
            job_run_id=str(task.claim_id),
        )

    def _fail_attempt(self, task: FanOutTask, exc: Exception) -> None:
        metrics.fanout_errors_total.inc()
        error = describe_error(exc, limit=500)
        log.warning(
            "fanout-task-failed",
            task_id=str(task.task_id),
            role_id=str(task.role_id),
            attempt=task.attempt,
            final=False,
            exception=error,
            job_run_id=str(task.claim_id),
        )
        self._release(task, count_attempt=True, error=error)

    def _release(self, task: FanOutTask, *, count_attempt: bool, error: str | None) -> None:
        """Hand the lease back now instead of letting it run out (a failed attempt waits a back-off)."""
        now = self._clock()
        available_at = now + self._settings.retry_delay(task.attempt) if count_attempt else now
        try:
            self._queue.release(
                task, now, available_at=available_at, count_attempt=count_attempt, error=error
            )
        except Exception as exc:  # the lease will simply expire
            log.warning("fanout-release-failed", task_id=str(task.task_id), error=type(exc).__name__)

"""What the fan-out job tells operators: its log lines (stable `event` names) and its metrics, in one place.

The job calls one hook per thing that happened; tests subclass the observer to wait on those hooks as
signals instead of polling or sleeping.
"""

from __future__ import annotations

from datetime import datetime

from pin_identity.observability import metrics
from pin_identity.observability.logging import describe_error, get_logger
from pin_identity.operations.ports.fanout_tasks import FanOutTask, PoisonedTask, QueueStats

log = get_logger("access-fanout")


class FanOutObserver:
    def worker_started(self, batch_size: int) -> None:
        """The job's loop began in this process: it claims tasks from now on."""
        log.info("fanout-worker-started", batch_size=batch_size)

    def job_started(self, task: FanOutTask) -> None:
        """A run of the job (the spec's jobRunId: this claim's id, the correlationId of its events) began."""
        log.info("fanout-job-started", job_run_id=str(task.claim_id), task_id=str(task.task_id))

    def idle(self) -> None:
        """No task was claimable: the job now waits for a wake-up or its polling interval."""

    def claim_failed(self, exc: Exception) -> None:
        metrics.fanout_errors_total.inc()
        log.warning("fanout-claim-failed", error=type(exc).__name__)

    def queue_stats(self, stats: QueueStats) -> None:
        metrics.record_fanout_queue(stats.backlog, stats.failed)

    def exhausted(self, task: PoisonedTask) -> None:
        metrics.fanout_tasks_total.labels(result="failed").inc()
        log.error(
            "fanout-task-failed",
            task_id=str(task.task_id),
            role_id=str(task.role_id),
            attempt=task.attempts,
            final=True,
            exception=task.last_error,
        )

    def dequeued(self, task: FanOutTask) -> None:
        log.info("fanout-task-dequeued", attempt=task.attempt, **_ids(task))

    def batch_committed(self, task: FanOutTask, rows: int, cursor: object) -> None:
        metrics.fanout_batches_total.inc()
        metrics.fanout_users_total.inc(rows)
        log.info(
            "fanout-batch-processed",
            role_id=str(task.role_id),
            rows=rows,
            cursor=str(cursor) if cursor else None,
            job_run_id=str(task.claim_id),
        )

    def completed(self, task: FanOutTask, processed: int, finished_at: datetime) -> None:
        """The task's last page committed: its lag counts from CreatedAt (the SLO), its duration from
        StartedAt, its first claim (a task resumed by a later claim took all of that)."""
        lag_s = max((finished_at - task.created_at).total_seconds(), 0.0)
        duration_s = max((finished_at - task.started_at).total_seconds(), 0.0)
        metrics.fanout_tasks_total.labels(result="completed").inc()
        metrics.fanout_task_lag_seconds.observe(lag_s)
        metrics.fanout_size.observe(processed)
        metrics.fanout_last_success.set(finished_at.timestamp())
        metrics.observe_fanout_task_duration(duration_s)
        log.info(
            "fanout-task-completed",
            processed_count=processed,
            duration_ms=round(duration_s * 1000),
            lag_s=round(lag_s, 3),
            **_ids(task),
        )

    def attempt_failed(self, task: FanOutTask, exc: Exception) -> str:
        """The failure as the task's last error records it (no contact data: `describe_error`)."""
        metrics.fanout_errors_total.inc()
        error = describe_error(exc, limit=500)
        log.warning("fanout-task-failed", attempt=task.attempt, final=False, exception=error, **_ids(task))
        return error

    def waited_for_relay(self, seconds: float) -> None:
        """A page waited for the outbox's backlog to fall: the fan-out's lag alert tells a slow relay from a
        slow fan-out by it, and the outbox's alert OutboxRelayBehind fires on it."""
        metrics.fanout_relay_wait_seconds_total.inc(max(seconds, 0.0))

    def relay_behind(self, task: FanOutTask, waiting: int) -> None:
        """A page waited its longest for the relay and goes anyway: the relay is slow or stopped."""
        log.warning("fanout-outbox-backlog-high", outbox_waiting=waiting, **_ids(task))

    def lease_lost(self, task: FanOutTask) -> None:
        log.warning("fanout-lease-lost", task_id=str(task.task_id), job_run_id=str(task.claim_id))

    def release_failed(self, task: FanOutTask, exc: Exception) -> None:
        log.warning("fanout-release-failed", task_id=str(task.task_id), error=type(exc).__name__)


def _ids(task: FanOutTask) -> dict[str, str]:
    return {"task_id": str(task.task_id), "role_id": str(task.role_id), "job_run_id": str(task.claim_id)}

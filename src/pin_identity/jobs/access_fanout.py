"""AccessFanOutJob: a role's permission set changed, so every user holding it hears UserAccessChanged.

One leased task at a time per worker; pages of the role's users by UserId; each page's events and the
task's checkpoint commit together, and the outbox relay publishes them after commit.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from enum import StrEnum

from pin_identity.config import FanOutSettings
from pin_identity.domain import events
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import LeaseLostError
from pin_identity.domain.model import AccessChangeReason
from pin_identity.jobs.access_fanout_observer import FanOutObserver
from pin_identity.observability.tracing import current_traceparent, traced, tracer
from pin_identity.operations.ports.fanout_tasks import FanOutQueue, FanOutTask, TaskWakeups
from pin_identity.operations.ports.job_control import StopSignal

_tracer = tracer("access-fanout")

# How often a page held back by the outbox's backlog looks again: the relay publishes about 600 events in it.
_PACE_LOOK_EVERY_S = 0.02


class TaskOutcome(StrEnum):
    COMPLETED = "completed"
    STOPPED = "stopped"
    LEASE_LOST = "lease_lost"
    ERROR = "error"


class AccessFanOutJob:
    def __init__(
        self,
        queue: FanOutQueue,
        wakeups: TaskWakeups,
        settings: FanOutSettings,
        clock: Clock,
        observer: FanOutObserver | None = None,
    ):
        self._queue = queue
        self._wakeups = wakeups
        self._settings = settings
        self._clock = clock
        self._lease = settings.lease_rules
        self._observer = observer or FanOutObserver()

    def run(self, stop: StopSignal, *, once: bool = False) -> None:
        """Take tasks until stopped; with `once`, until no task is claimable."""
        self._observer.worker_started(self._settings.batch_size)
        try:
            while not stop.is_set():
                if self.step(stop):
                    continue
                if once:
                    break
                self._observer.idle()
                self._await_task(stop)
        finally:
            self._wakeups.close()

    def step(self, stop: StopSignal) -> bool:
        """Claim and process one task; True when a task was taken."""
        try:
            task = self._claim()
        except Exception as exc:  # the database is away: the caller waits a polling interval
            self._observer.claim_failed(exc)
            return False
        if task is None:
            return False
        self.process(task, stop)
        return True

    def _await_task(self, stop: StopSignal) -> None:
        """Until a task is announced or PollingInterval passes (the fallback), checking for a stop."""
        deadline = self._clock.monotonic() + self._settings.polling_interval_s
        while not stop.is_set() and (left := deadline - self._clock.monotonic()) > 0:
            if self._wakeups.wait(min(left, 0.5)):
                return

    def _claim(self) -> FanOutTask | None:
        now = self._clock.now()
        for poisoned in self._queue.fail_exhausted(now, self._lease.max_attempts):
            self._observer.exhausted(poisoned)
        self._observer.queue_stats(self._queue.stats(now))
        return self._queue.claim(uuid.uuid4(), now, self._lease.until(now))

    def process(self, task: FanOutTask, stop: StopSignal) -> TaskOutcome:
        """Pages until the role is done, the lease is lost, the worker stops, or a batch fails: one run of
        the job, under its claim's jobRunId."""
        self._observer.job_started(task)
        self._observer.dequeued(task)
        attributes: dict[str, str | int] = {
            "jobRunId": str(task.claim_id),
            "taskId": str(task.task_id),
            "roleId": str(task.role_id),
            "roleVersion": task.role_version,
            "attempt": task.attempt,
            "batchSize": self._settings.batch_size,
        }
        with traced(_tracer, "access-fanout.task", attributes) as span:
            outcome, processed = self._pages(task, stop)
            # The task's users told so far, earlier claims' pages included (its ProcessedCount).
            span.set_attribute("processedCount", processed)
            span.set_attribute("outcome", outcome.value)
        return outcome

    def _pages(self, task: FanOutTask, stop: StopSignal) -> tuple[TaskOutcome, int]:
        """Each batch continues from the checkpoint the one before it left (`task` advanced), which its fence
        finds stored or refuses: a checkpoint the server lost is resumed by the next claim, not skipped."""
        while True:
            self._pace(task, stop)
            if stop.is_set():
                self._release(task, count_attempt=False, error=None)
                return TaskOutcome.STOPPED, task.processed_count
            try:
                page_size, task = self._batch(task)
            except LeaseLostError:
                self._observer.lease_lost(task)
                return TaskOutcome.LEASE_LOST, task.processed_count
            except Exception as exc:
                self._release(task, count_attempt=True, error=self._observer.attempt_failed(task, exc))
                return TaskOutcome.ERROR, task.processed_count
            if page_size < self._settings.batch_size:
                self._observer.completed(task, task.processed_count, self._clock.now())
                return TaskOutcome.COMPLETED, task.processed_count

    def _pace(self, task: FanOutTask, stop: StopSignal) -> None:
        """While more events wait in the outbox than the limit, the next page waits (a while at most, and
        never a tenth of the lease: a relay that is down stops no fan-out, whose lease each page renews)."""
        limit = self._settings.outbox_backlog_limit
        if not limit:
            return
        started, waited = self._clock.monotonic(), False
        deadline = started + min(self._settings.outbox_wait_max_s, self._settings.max_lease_s / 10)
        try:
            while (waiting := self._queue.outbox_waiting(cap=limit + 1)) > limit:
                if self._clock.monotonic() >= deadline:
                    self._observer.relay_behind(task, waiting)
                    return
                waited = True
                if stop.wait(_PACE_LOOK_EVERY_S):
                    return
        except Exception:  # noqa: S110 - the page itself meets the database's failure, logs and counts it
            pass
        finally:
            if waited:
                self._observer.waited_for_relay(self._clock.monotonic() - started)

    def _batch(self, task: FanOutTask) -> tuple[int, FanOutTask]:
        """One page in one transaction: its events and the advanced checkpoint, or nothing at all; the page's
        size and the task as advanced."""
        size = self._settings.batch_size
        now = self._clock.now()
        with (
            traced(_tracer, "access-fanout.batch", {"batchSize": size}) as span,
            self._queue.batch(task, now, self._lease.until(now)) as batch,
        ):
            template = events.access_changed_template(
                reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
                version=task.role_version,
                changed_role_id=task.role_id,
                correlation_id=task.claim_id,
                occurred_at=now,
                traceparent=current_traceparent(),
            )
            page = batch.write_page(task.role_id, task.cursor, size, template)
            next_cursor = page.last_user_id or task.cursor
            batch.advance(cursor=next_cursor, processed=page.size, completed=page.size < size)
            batch.commit()
            span.set_attribute("processedCount", page.size)
        self._observer.batch_committed(task, page.size, next_cursor)
        return page.size, replace(task, cursor=next_cursor, processed_count=task.processed_count + page.size)

    def _release(self, task: FanOutTask, *, count_attempt: bool, error: str | None) -> None:
        """Hand the lease back now instead of letting it run out (a failed attempt waits a back-off)."""
        now = self._clock.now()
        release = self._lease.release(now, task.attempt, count_attempt=count_attempt, error=error)
        try:
            self._queue.release(task, now, release)
        except Exception as exc:  # the lease will simply expire
            self._observer.release_failed(task, exc)

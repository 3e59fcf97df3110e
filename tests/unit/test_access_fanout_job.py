"""The fan-out job's decisions over an in-memory queue: paging, completion, attempts, stop."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from pin_identity.config import FanOutSettings
from pin_identity.domain.errors import LeaseLostError
from pin_identity.domain.events import AccessChangeTemplate, OutboxMessage
from pin_identity.domain.lease import Release
from pin_identity.jobs.access_fanout import AccessFanOutJob, TaskOutcome
from pin_identity.jobs.access_fanout_observer import FanOutObserver
from pin_identity.operations.ports.fanout_tasks import (
    FanOutTask,
    PageWritten,
    PoisonedTask,
    QueueStats,
)
from tests.support.clocks import ClockedStop, ManualClock
from tests.support.fanout import NoWakeups


class MemoryBatch:
    def __init__(self, queue: MemoryFanOutQueue):
        self._queue = queue
        self.pending_events: list[OutboxMessage] = []
        self.pending_advance: tuple[UUID | None, int, bool] | None = None

    def write_page(
        self, role_id: UUID, after: UUID | None, size: int, template: AccessChangeTemplate
    ) -> PageWritten:
        if self._queue.fail_pages:
            raise RuntimeError("database went away")
        users = [u for u in self._queue.users if after is None or u > after][:size]
        self.pending_events += [template.fill(u, None, "[]") for u in users]
        return PageWritten(len(users), users[-1] if users else None)

    def advance(self, *, cursor: UUID | None, processed: int, completed: bool) -> None:
        self.pending_advance = (cursor, processed, completed)

    def commit(self) -> None:
        self._queue.events.extend(self.pending_events)
        self._queue.advances.append(self.pending_advance)


class MemoryFanOutQueue:
    def __init__(self, users: int):
        self.users = sorted(uuid.uuid4() for _ in range(users))
        self.events: list[OutboxMessage] = []
        self.advances: list[tuple[UUID | None, int, bool] | None] = []
        self.releases: list[tuple[bool, str | None, datetime]] = []
        self.fail_pages = False
        self.lease_lost_after: int | None = None
        self.outbox_backlog: list[int] = []  # what outbox_waiting answers, one look at a time; then 0
        self.looks_before_page: list[int] = []
        self._looks = 0

    def fail_exhausted(self, now: datetime, max_attempts: int) -> list[PoisonedTask]:
        return []

    def claim(self, claim_id: UUID, now: datetime, lease_until: datetime) -> FanOutTask | None:
        return None

    @contextmanager
    def batch(self, task: FanOutTask, now: datetime, lease_until: datetime) -> Iterator[MemoryBatch]:
        if self.lease_lost_after is not None and len(self.advances) >= self.lease_lost_after:
            raise LeaseLostError(str(task.task_id))
        self.looks_before_page.append(self._looks)
        self._looks = 0
        yield MemoryBatch(self)

    def release(self, task: FanOutTask, now: datetime, release: Release) -> None:
        self.releases.append((release.count_attempt, release.error, release.available_at))

    def stats(self, now: datetime) -> QueueStats:
        return QueueStats(0, 0)

    def outbox_waiting(self, cap: int) -> int:
        self._looks += 1
        return self.outbox_backlog.pop(0) if self.outbox_backlog else 0


def _task(attempt: int = 1) -> FanOutTask:
    now = datetime.now(UTC)
    return FanOutTask(uuid.uuid4(), uuid.uuid4(), None, 7, None, 0, attempt, now, uuid.uuid4(), now)


def _job(queue: MemoryFanOutQueue, clock: ManualClock, batch_size: int = 10) -> AccessFanOutJob:
    return AccessFanOutJob(queue, NoWakeups(), FanOutSettings(batch_size=batch_size), clock)


def test_pages_until_a_short_page_and_completes_there() -> None:
    queue = MemoryFanOutQueue(25)
    assert _job(queue, ManualClock()).process(_task(), threading.Event()) == TaskOutcome.COMPLETED
    assert [a[1:] for a in queue.advances if a] == [(10, False), (10, False), (5, True)]
    assert queue.advances[-1] is not None and queue.advances[-1][0] == queue.users[-1]
    assert len(queue.events) == 25


def test_a_full_last_page_completes_with_an_empty_one() -> None:
    queue = MemoryFanOutQueue(20)
    _job(queue, ManualClock()).process(_task(), threading.Event())
    assert [a[1:] for a in queue.advances if a] == [(10, False), (10, False), (0, True)]


def test_an_error_releases_the_lease_after_a_back_off_and_counts_the_attempt() -> None:
    queue, clock = MemoryFanOutQueue(5), ManualClock()
    queue.fail_pages = True
    assert _job(queue, clock).process(_task(attempt=3), threading.Event()) == TaskOutcome.ERROR
    [(counted, error, available_at)] = queue.releases
    assert counted and error is not None and "database went away" in error
    assert available_at == clock.now() + timedelta(seconds=8)


def test_a_stop_releases_at_once_without_counting_the_attempt() -> None:
    queue, clock, stop = MemoryFanOutQueue(5), ManualClock(), threading.Event()
    stop.set()
    assert _job(queue, clock).process(_task(), stop) == TaskOutcome.STOPPED
    assert queue.releases == [(False, None, clock.now())]
    assert queue.events == []


def test_a_lost_lease_stops_writing_and_releases_nothing() -> None:
    queue = MemoryFanOutQueue(30)
    queue.lease_lost_after = 1
    assert _job(queue, ManualClock()).process(_task(), threading.Event()) == TaskOutcome.LEASE_LOST
    assert len(queue.events) == 10 and queue.releases == []


def test_a_page_waits_while_the_outbox_holds_more_than_its_limit() -> None:
    queue = MemoryFanOutQueue(25)
    queue.outbox_backlog = [0, 30_000, 25_000, 20_001, 20_000]  # the second page waits three looks
    settings = FanOutSettings(batch_size=10, outbox_backlog_limit=20_000)
    clock = ManualClock()
    job = AccessFanOutJob(queue, NoWakeups(), settings, clock)
    assert job.process(_task(), ClockedStop(clock)) == TaskOutcome.COMPLETED
    assert queue.looks_before_page == [1, 4, 1] and len(queue.events) == 25


class _StopWhileWaiting(threading.Event):
    def wait(self, timeout: float | None = None) -> bool:
        self.set()
        return True


def test_a_page_waits_for_the_relay_at_most_a_while_and_not_past_a_stop() -> None:
    queue = MemoryFanOutQueue(15)
    queue.outbox_backlog = [50_000] * 10_000  # a relay that is down
    clock, settings = ManualClock(), FanOutSettings(batch_size=10)
    job = AccessFanOutJob(queue, NoWakeups(), settings, clock)
    with capture_logs() as logs:
        assert job.process(_task(), ClockedStop(clock)) == TaskOutcome.COMPLETED
    assert len(queue.events) == 15 and all(looks >= 2 for looks in queue.looks_before_page)
    assert clock.monotonic() == 2 * settings.outbox_wait_max_s  # each page waited its longest, no more
    assert [line["outbox_waiting"] for line in logs if line["event"] == "fanout-outbox-backlog-high"] == [
        50_000
    ] * 2
    stop = _StopWhileWaiting()
    stopped = MemoryFanOutQueue(15)
    stopped.outbox_backlog = [50_000] * 10
    assert _job(stopped, ManualClock()).process(_task(), stop) == TaskOutcome.STOPPED
    assert stopped.events == []


def test_a_span_per_task_and_per_batch() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    queue = MemoryFanOutQueue(15)
    task = _task()
    _job(queue, ManualClock()).process(task, threading.Event())

    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["access-fanout.batch", "access-fanout.batch", "access-fanout.task"]
    task_span = spans[-1]
    assert task_span.attributes is not None
    assert task_span.attributes["jobRunId"] == str(task.claim_id)
    assert task_span.attributes["roleId"] == str(task.role_id)
    # The spec's attributes: the page size, and the users the task told.
    assert (task_span.attributes["batchSize"], task_span.attributes["processedCount"]) == (10, 15)
    assert all(s.parent is not None and s.parent.span_id == task_span.context.span_id for s in spans[:2])
    # With tracing on, the events carry the batch span's W3C traceparent.
    assert all(m.traceparent and m.traceparent.startswith("00-") for m in queue.events)


class RecordingObserver(FanOutObserver):
    """The hooks the job called, in order: what operators see, and what tests can wait on."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def dequeued(self, task: FanOutTask) -> None:
        self.calls.append("dequeued")

    def batch_committed(self, task: FanOutTask, rows: int, cursor: object) -> None:
        self.calls.append(f"batch {rows}")

    def completed(self, task: FanOutTask, processed: int, finished_at: datetime) -> None:
        self.calls.append(f"completed {processed}")

    def attempt_failed(self, task: FanOutTask, exc: Exception) -> str:
        self.calls.append(f"failed {exc}")
        return "described"

    def lease_lost(self, task: FanOutTask) -> None:
        self.calls.append("lease lost")


def _observed(queue: MemoryFanOutQueue) -> tuple[AccessFanOutJob, RecordingObserver]:
    observer = RecordingObserver()
    settings = FanOutSettings(batch_size=10)
    return AccessFanOutJob(queue, NoWakeups(), settings, ManualClock(), observer), observer


def test_the_observer_hears_each_batch_and_the_end_once() -> None:
    queue = MemoryFanOutQueue(15)
    job, observer = _observed(queue)
    job.process(_task(), threading.Event())
    assert observer.calls == ["dequeued", "batch 10", "batch 5", "completed 15"]


def test_the_observer_describes_a_failure_and_the_release_records_its_words() -> None:
    queue = MemoryFanOutQueue(15)
    queue.fail_pages = True
    job, observer = _observed(queue)
    job.process(_task(), threading.Event())
    assert observer.calls == ["dequeued", "failed database went away"]
    assert [(counted, error) for counted, error, _ in queue.releases] == [(True, "described")]


def test_the_observer_hears_a_lost_lease_and_nothing_is_released() -> None:
    queue = MemoryFanOutQueue(30)
    queue.lease_lost_after = 1
    job, observer = _observed(queue)
    assert job.process(_task(), threading.Event()) == TaskOutcome.LEASE_LOST
    assert observer.calls == ["dequeued", "batch 10", "lease lost"]
    assert queue.releases == []


def test_a_job_run_starts_with_its_job_run_id_and_its_duration_counts_from_started_at() -> None:
    """The spec's log lines and histogram: `fanout-job-started` with the claim's jobRunId, and a task resumed
    by a later claim completes with durationMs and a duration measured from its StartedAt (its first claim),
    not from the claim that finished it."""
    clock = ManualClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    queue = MemoryFanOutQueue(15)
    first_claimed = clock.now() - timedelta(minutes=10)
    task = replace(_task(), created_at=first_claimed - timedelta(minutes=5), started_at=first_claimed)
    before = REGISTRY.get_sample_value("identity_access_fanout_task_duration_seconds_sum") or 0.0

    with capture_logs() as logs:
        _job(queue, clock).process(task, threading.Event())

    started = [line for line in logs if line["event"] == "fanout-job-started"]
    assert [line["job_run_id"] for line in started] == [str(task.claim_id)]
    [completed] = [line for line in logs if line["event"] == "fanout-task-completed"]
    assert completed["duration_ms"] == 600_000
    after = REGISTRY.get_sample_value("identity_access_fanout_task_duration_seconds_sum") or 0.0
    assert after - before == pytest.approx(600)  # a sum of floats other tests of the process added to


def test_the_time_pages_wait_for_the_relay_is_counted() -> None:
    """The fan-out's alert can tell a slow relay from a slow fan-out: the seconds its pages waited for the
    outbox's backlog to fall (identity_access_fanout_relay_wait_seconds_total)."""
    counted = lambda: REGISTRY.get_sample_value("identity_access_fanout_relay_wait_seconds_total") or 0.0  # noqa: E731
    queue = MemoryFanOutQueue(15)
    queue.outbox_backlog = [50_000] * 10_000  # a relay that is down
    clock, settings = ManualClock(), FanOutSettings(batch_size=10)
    before = counted()

    AccessFanOutJob(queue, NoWakeups(), settings, clock).process(_task(), ClockedStop(clock))

    assert counted() - before == 2 * settings.outbox_wait_max_s  # two pages, each its longest

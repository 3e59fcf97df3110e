"""AccessFanOutJob on real PostgreSQL and the real broker: one test per row of the spec's Тесты table,
plus an archived role and a lease that expires under a paused worker."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from uuid import UUID

import psycopg
import pytest

from pin_identity.adapters.kafka.embedded_kafka import free_port
from pin_identity.adapters.postgres.database import Database
from pin_identity.adapters.postgres.fanout_queue import (
    PostgresFanOutBatch,
    PostgresFanOutQueue,
    PostgresTaskWakeups,
)
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.composition.connections import Connections
from pin_identity.composition.stores import Stores
from pin_identity.config import FanOutSettings
from pin_identity.domain import events
from pin_identity.domain.access_cache import CacheDecision, UserAccessCache
from pin_identity.domain.events import AccessChangeTemplate
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.model import AccessChangeReason, Scope, ScopeType
from pin_identity.jobs.access_fanout import AccessFanOutJob, TaskOutcome
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from pin_identity.operations.ports.fanout_tasks import FanOutTask, PageWritten
from tests.support import seed
from tests.support.clocks import ManualClock
from tests.support.databases import through_port
from tests.support.fanout import fanout_job, run_until_idle
from tests.support.kafka_tap import ConsumedEvent, EventTap
from tests.support.relay import outbox_count, publish_outbox
from tests.support.schemas import validate_event
from tests.support.waiting import wait_until

QUEUED = FanOutPolicy(inline_threshold=0)


def _task_row(database_url: str, task_id: UUID) -> dict[str, object]:
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute("SELECT * FROM identity.access_fanout_tasks WHERE id = %s", (task_id,)).fetchone()
    assert row is not None
    return row


def _fanout_events(tap: EventTap, role_id: UUID, count: int) -> list[ConsumedEvent]:
    return tap.wait_for(lambda e: _changed_by(e, role_id), count, timeout_s=60)


def _every_fanout_event(tap: EventTap, role_id: UUID) -> list[ConsumedEvent]:
    """Every event of the role on the topic (called once the outbox is drained): an exactly-once assertion
    must see a late duplicate, which waiting for the expected count alone would return before."""
    return tap.read_to_end(lambda e: _changed_by(e, role_id))


def _changed_by(event: ConsumedEvent, role_id: UUID) -> bool:
    return event.payload.get("changedRoleId") == str(role_id) and (
        event.payload.get("changeReason") == "RolePermissionsChanged"
    )


def _change_permissions(container: Container, role_id: UUID) -> UUID:
    change = seed.change_permissions(container.stores.identity_transactions, role_id, ["deals.read"], QUEUED)
    assert change.task_id is not None
    return change.task_id


def _claimed_change(
    container: Container, database_url: str, clock: ManualClock
) -> tuple[UUID, list[UUID], UUID, FanOutTask]:
    """A role of 40 users changed, its task claimed for five minutes by a worker that has not begun it."""
    _, role_id, users = seed.bulk_held_role(container.stores.identity_transactions, database_url, 40)
    task_id = _change_permissions(container, role_id)
    task = container.stores.fanout_queue.claim(
        uuid.uuid4(), clock.now(), clock.now() + timedelta(seconds=300)
    )
    assert task is not None
    return role_id, users, task_id, task


def test_empty_role_completes_at_once_without_events(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    company_id = seed.company(stores.identity_transactions)
    role_id = seed.role(stores.identity_transactions, company_id)
    user_id = seed.user(stores.identity_transactions, company_id)
    assignment = seed.grant(stores.identity_transactions, user_id, role_id, company_id)
    task_id = _change_permissions(container, role_id)
    identity_changes.revoke_role_assignment(
        stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), assignment
    )

    run_until_idle(fanout_job(container, ManualClock()))
    publish_outbox(container)

    task = _task_row(database_url, task_id)
    assert (task["status"], task["processed_count"], task["cursor"]) == ("Completed", 0, None)
    assert task["completed_at"] is not None and task["lease_expires_at"] is None
    assert tap.read_to_end(lambda e: _changed_by(e, role_id)) == []


def test_mass_fanout_sends_one_event_per_unique_user_across_all_pages(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    _, role_id, users = seed.bulk_held_role(stores.identity_transactions, database_url, 173)
    for user_id in users[:20]:  # a second assignment of the same role must not make a second event
        seed.grant_in(
            stores.identity_transactions, user_id, role_id, identity_changes.Scope.organization(uuid.uuid4())
        )
    task_id = _change_permissions(container, role_id)

    run_until_idle(fanout_job(container, ManualClock(), batch_size=50))
    publish_outbox(container)

    events = _every_fanout_event(tap, role_id)
    assert Counter(e.key for e in events) == Counter(str(u) for u in users)
    task = _task_row(database_url, task_id)
    assert (task["status"], task["processed_count"], task["cursor"]) == ("Completed", 173, max(users))
    for event in events:
        validate_event(event.body)
        assert event.payload["version"] == 2
        assert event.headers["correlation-id"] == event.body["correlationId"]
    assert len({e.body["correlationId"] for e in events}) == 1  # the jobRunId of the one claim


def test_full_snapshot_holds_every_active_assignment_with_role_codes(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    company_id, role_id, users = seed.bulk_held_role(stores.identity_transactions, database_url, 3)
    other_role = seed.role(stores.identity_transactions, company_id, "chessboard-viewer")
    extra = seed.grant(stores.identity_transactions, users[1], other_role, company_id)
    revoked = seed.grant(
        stores.identity_transactions,
        users[1],
        seed.role(stores.identity_transactions, company_id, "gone"),
        company_id,
    )
    identity_changes.revoke_role_assignment(
        stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), revoked
    )
    _change_permissions(container, role_id)

    run_until_idle(fanout_job(container, ManualClock()))
    publish_outbox(container)

    by_user = {e.key: e.payload for e in _fanout_events(tap, role_id, 3)}
    assignments = by_user[str(users[1])]["activeAssignments"]
    assert sorted(a["roleCode"] for a in assignments) == ["chessboard-viewer", "sales-manager"]
    assert str(extra) in {a["assignmentId"] for a in assignments}
    assert [a["assignmentId"] for a in assignments] == sorted(a["assignmentId"] for a in assignments)
    assert [a["roleCode"] for a in by_user[str(users[0])]["activeAssignments"]] == ["sales-manager"]
    assert by_user[str(users[0])]["companyId"] == str(company_id)


class CrashAfter:
    """The real queue, except that the process 'dies' once N batches committed: right after the Nth
    commit, or (before_commit) while committing the next one."""

    def __init__(self, queue: PostgresFanOutQueue, batches: int, *, before_commit: bool = False):
        self._queue, self._batches, self._before_commit = queue, batches, before_commit
        self._opened = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._queue, name)

    @contextmanager
    def batch(self, task: FanOutTask, now: datetime, lease_until: datetime) -> Iterator[PostgresFanOutBatch]:
        with self._queue.batch(task, now, lease_until) as batch:
            self._opened += 1
            if self._before_commit and self._opened > self._batches:
                batch.commit = _die  # type: ignore[method-assign]
            yield batch
        if not self._before_commit and self._opened == self._batches:
            raise _Died


class _Died(BaseException):
    """Not an Exception: nothing in the job catches it, as nothing survives a SIGKILL."""


def _die() -> None:
    raise _Died


@pytest.mark.parametrize("before_commit", [False, True], ids=["after-commit", "before-commit"])
def test_restart_resumes_from_the_cursor_and_repeats_at_most_the_batch_in_flight(
    container: Container, stores: Stores, database_url: str, tap: EventTap, before_commit: bool
) -> None:
    _, role_id, users = seed.bulk_held_role(stores.identity_transactions, database_url, 120)
    task_id = _change_permissions(container, role_id)
    clock = ManualClock()

    with pytest.raises(_Died):
        run_until_idle(
            fanout_job(
                container,
                clock,
                batch_size=25,
                queue=CrashAfter(stores.fanout_queue, 2, before_commit=before_commit),
            )
        )
    task = _task_row(database_url, task_id)
    assert (task["status"], task["processed_count"], task["cursor"]) == ("InProgress", 50, users[49])

    run_until_idle(fanout_job(container, clock, batch_size=25))  # the dead worker's lease still holds
    assert _task_row(database_url, task_id)["status"] == "InProgress"
    clock.advance(301)
    run_until_idle(fanout_job(container, clock, batch_size=25))
    publish_outbox(container)

    events = _every_fanout_event(tap, role_id)
    assert Counter(e.key for e in events) == Counter(str(u) for u in users)  # nothing lost, nothing twice
    task = _task_row(database_url, task_id)
    assert (task["status"], task["processed_count"]) == ("Completed", 120)


def test_parallel_workers_never_share_a_task(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    roles = [seed.bulk_held_role(stores.identity_transactions, database_url, 60)[1] for _ in range(4)]
    task_ids = [_change_permissions(container, role_id) for role_id in roles]
    clock = ManualClock()
    workers = [
        threading.Thread(target=run_until_idle, args=(fanout_job(container, clock, batch_size=10),))
        for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    publish_outbox(container)

    settled = tap.read_to_end(lambda e: any(_changed_by(e, role_id) for role_id in roles))
    for role_id, task_id in zip(roles, task_ids, strict=True):
        events = [e for e in settled if _changed_by(e, role_id)]
        assert len(events) == 60 and len({e.key for e in events}) == 60
        # One claim did all of a task's batches: every event carries the same jobRunId.
        assert len({e.body["correlationId"] for e in events}) == 1
        assert _task_row(database_url, task_id)["status"] == "Completed"


def test_events_carry_the_task_role_version_and_a_newer_cache_drops_them(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    _, role_id, _ = seed.bulk_held_role(stores.identity_transactions, database_url, 5)
    _change_permissions(container, role_id)  # version 2, its task Pending
    _change_permissions(container, role_id)  # version 3 coalesces into the same task
    run_until_idle(fanout_job(container, ManualClock()))
    publish_outbox(container)
    events = _fanout_events(tap, role_id, 5)
    assert {e.payload["version"] for e in events} == {3}

    cache = UserAccessCache()
    newer = {**events[0].payload, "version": 4, "activeAssignments": []}
    assert cache.apply(newer) is CacheDecision.APPLIED
    assert cache.apply(events[0].payload) is CacheDecision.DROPPED_STALE
    assert cache.assignments[events[0].key] == []
    assert cache.apply(events[1].payload) is CacheDecision.APPLIED


class FailingRole:
    """The real queue, except that reading pages of one role fails: a poison task."""

    def __init__(self, queue: PostgresFanOutQueue, role_id: UUID):
        self._queue, self._role_id = queue, role_id

    def __getattr__(self, name: str) -> object:
        return getattr(self._queue, name)

    @contextmanager
    def batch(self, task: FanOutTask, now: datetime, lease_until: datetime) -> Iterator[PostgresFanOutBatch]:
        with self._queue.batch(task, now, lease_until) as batch:
            if task.role_id == self._role_id:
                batch.write_page = self._fail  # type: ignore[method-assign]
            yield batch

    @staticmethod
    def _fail(role_id: UUID, after: UUID | None, size: int, template: AccessChangeTemplate) -> PageWritten:
        raise RuntimeError("snapshot query failed")


def test_poison_task_fails_after_max_attempts_and_blocks_no_other_task(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    _, poison_role, _ = seed.bulk_held_role(stores.identity_transactions, database_url, 10)
    _, healthy_role, _ = seed.bulk_held_role(stores.identity_transactions, database_url, 10)
    poison_task = _change_permissions(container, poison_role)
    healthy_task = _change_permissions(container, healthy_role)
    clock = ManualClock()
    job = fanout_job(container, clock, max_attempts=3, queue=FailingRole(stores.fanout_queue, poison_role))

    run_until_idle(job)
    assert _task_row(database_url, healthy_task)["status"] == "Completed"
    for attempt in (1, 2, 3):
        row = _task_row(database_url, poison_task)
        assert (row["status"], row["attempt_count"]) == ("InProgress", attempt)
        assert "snapshot query failed" in str(row["last_error"])
        clock.advance(600)  # past the back-off
        run_until_idle(job)
    row = _task_row(database_url, poison_task)
    assert (row["status"], row["attempt_count"]) == ("Failed", 3)
    publish_outbox(container)
    assert len(_every_fanout_event(tap, healthy_role)) == 10

    stores.fanout_queue.replay(poison_task, clock.now())  # the runbook, once the cause is fixed
    run_until_idle(fanout_job(container, clock))
    assert _task_row(database_url, poison_task)["status"] == "Completed"


class AfterEachBatch:
    """The real queue, with a hook run right after each batch the worker committed."""

    def __init__(self, queue: PostgresFanOutQueue):
        self._queue = queue

    def __getattr__(self, name: str) -> object:
        return getattr(self._queue, name)

    @contextmanager
    def batch(self, task: FanOutTask, now: datetime, lease_until: datetime) -> Iterator[PostgresFanOutBatch]:
        with self._queue.batch(task, now, lease_until) as batch:
            yield batch
        self.after(task)

    def after(self, task: FanOutTask) -> None:
        raise NotImplementedError


class StopAfterFirstBatch(AfterEachBatch):
    def __init__(self, queue: PostgresFanOutQueue, stop: threading.Event):
        super().__init__(queue)
        self._stop = stop

    def after(self, task: FanOutTask) -> None:
        self._stop.set()  # SIGTERM arrives while the first batch commits


def test_cancellation_between_batches_keeps_committed_batches_and_releases_the_lease(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    _, role_id, users = seed.bulk_held_role(stores.identity_transactions, database_url, 30)
    task_id = _change_permissions(container, role_id)
    clock, stop = ManualClock(), threading.Event()
    job = fanout_job(container, clock, batch_size=10, queue=StopAfterFirstBatch(stores.fanout_queue, stop))
    job.run(stop)

    row = _task_row(database_url, task_id)
    assert (row["status"], row["processed_count"], row["cursor"]) == ("InProgress", 10, users[9])
    assert (
        row["lease_expires_at"] == clock.now() and row["attempt_count"] == 0
    )  # free at once, attempt not counted
    run_until_idle(fanout_job(container, clock, batch_size=10))
    publish_outbox(container)
    assert Counter(e.key for e in _every_fanout_event(tap, role_id)) == Counter(str(u) for u in users)
    assert _task_row(database_url, task_id)["status"] == "Completed"


def test_role_archived_between_enqueue_and_processing(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    company_id = seed.company(stores.identity_transactions)
    role_id = seed.role(stores.identity_transactions, company_id)
    other = seed.role(stores.identity_transactions, company_id, "kept")
    users = [seed.user(stores.identity_transactions, company_id) for _ in range(3)]
    for user_id in users:
        seed.grant(stores.identity_transactions, user_id, role_id, company_id)
    seed.grant(stores.identity_transactions, users[0], other, company_id)
    task_id = _change_permissions(container, role_id)
    identity_changes.archive_role(stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), role_id)

    run_until_idle(fanout_job(container, ManualClock()))
    publish_outbox(container)

    task = _task_row(database_url, task_id)
    assert (task["status"], task["processed_count"]) == ("Completed", 0)
    archived = tap.wait_for(
        lambda e: (
            e.payload.get("changeReason") == "RoleArchived" and e.payload["changedRoleId"] == str(role_id)
        ),
        3,
    )
    assert [
        a["roleCode"] for a in {e.key: e for e in archived}[str(users[0])].payload["activeAssignments"]
    ] == ["kept"]
    assert tap.read_to_end(lambda e: _changed_by(e, role_id)) == []


class LosesItsSecondPage(AfterEachBatch):
    """The real queue on a server that loses a committed page: right after the second batch commits, the
    server is back at the first batch's state (the task's checkpoint and the page's outbox rows gone), the
    claim as it was: a crash that lost a page's unflushed commit, or a failover to a standby without it."""

    def __init__(self, queue: PostgresFanOutQueue, database_url: str):
        super().__init__(queue)
        self._database_url, self._batches = database_url, 0

    def after(self, task: FanOutTask) -> None:
        self._batches += 1
        if self._batches != 2:
            return
        with psycopg.connect(self._database_url) as conn:
            conn.execute(
                """DELETE FROM identity.outbox_events WHERE id IN (
                       SELECT id FROM identity.outbox_events ORDER BY id DESC LIMIT %s)""",
                (task.processed_count,),  # the second page: as many users as the first
            )
            conn.execute(
                "UPDATE identity.access_fanout_tasks SET cursor = %s, processed_count = %s WHERE id = %s",
                (task.cursor, task.processed_count, task.task_id),
            )


def test_a_page_the_server_lost_is_written_again_not_skipped(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    """The worker's claim survives the server's loss of its last page (pages commit without waiting for their
    WAL): its next batch must not go on from where the worker thinks it is, but from where the server is."""
    _, role_id, users = seed.bulk_held_role(stores.identity_transactions, database_url, 100)
    task_id = _change_permissions(container, role_id)
    clock = ManualClock()
    queue = LosesItsSecondPage(stores.fanout_queue, database_url)

    run_until_idle(fanout_job(container, clock, batch_size=25, queue=queue))  # its third batch is refused
    task = _task_row(database_url, task_id)
    assert (task["status"], task["processed_count"], task["cursor"]) == ("InProgress", 25, users[24])
    clock.advance(301)  # the claim's lease over (after a failover, its holder's session is gone at once)
    run_until_idle(fanout_job(container, clock, batch_size=25))
    publish_outbox(container)

    events = _every_fanout_event(tap, role_id)
    assert Counter(e.key for e in events) == Counter(str(u) for u in users)  # nothing lost, nothing twice
    assert _task_row(database_url, task_id)["status"] == "Completed"


def test_a_paused_worker_whose_lease_expired_cannot_commit(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    clock = ManualClock()
    role_id, users, task_id, task = _claimed_change(container, database_url, clock)
    paused_stop = threading.Event()
    paused = fanout_job(
        container, clock, batch_size=10, queue=StopAfterFirstBatch(stores.fanout_queue, paused_stop)
    )

    # The paused worker commits one batch, then hangs (GC pause, network partition) past its lease.
    paused._batch(task)
    clock.advance(301)
    run_until_idle(fanout_job(container, clock, batch_size=10))  # another worker takes over and finishes
    assert _task_row(database_url, task_id)["status"] == "Completed"

    outcome = paused.process(task, threading.Event())  # the paused worker wakes up
    assert outcome == TaskOutcome.LEASE_LOST
    publish_outbox(container)
    events = _every_fanout_event(tap, role_id)
    assert Counter(e.key for e in events) == Counter(str(u) for u in users)
    assert _task_row(database_url, task_id)["processed_count"] == 40


class HoldAfterFirstBatch(AfterEachBatch):
    """The real queue, except that the worker stops right after its first batch committed until the test
    lets it go: a pause between batches, holding no connection and no lock, its lease running."""

    def __init__(self, queue: PostgresFanOutQueue):
        super().__init__(queue)
        self.held, self.resume = threading.Event(), threading.Event()
        self.claim_id: UUID | None = None

    def after(self, task: FanOutTask) -> None:
        if self.claim_id is None:
            self.claim_id = task.claim_id
            self.held.set()
            assert self.resume.wait(30), "the test never let the worker go"


def test_a_paused_worker_cannot_write_while_the_worker_that_took_over_holds_the_task(
    container: Container, stores: Stores, database_url: str, tap: EventTap
) -> None:
    """The task is still InProgress when the paused worker wakes: only the claim id can refuse it."""
    clock = ManualClock()
    role_id, users, task_id, task = _claimed_change(container, database_url, clock)
    paused_queue, taker_queue = (HoldAfterFirstBatch(stores.fanout_queue) for _ in range(2))
    paused = fanout_job(container, clock, batch_size=10, queue=paused_queue)
    taker = fanout_job(container, clock, batch_size=10, queue=taker_queue)

    with ThreadPoolExecutor(2) as pool:
        try:
            paused_outcome = pool.submit(paused.process, task, threading.Event())
            assert paused_queue.held.wait(30)  # one batch committed, then a pause past the lease
            clock.advance(301)
            taken_over = pool.submit(run_until_idle, taker)
            assert taker_queue.held.wait(30)  # the new holder committed a batch and goes on later
            before = outbox_count(database_url)

            paused_queue.resume.set()
            assert paused_outcome.result(30) == TaskOutcome.LEASE_LOST
            assert outbox_count(database_url) == before
            row = _task_row(database_url, task_id)
            assert (row["status"], row["lease_owner"]) == ("InProgress", taker_queue.claim_id)
            assert (row["cursor"], row["processed_count"]) == (users[19], 20)
        finally:
            paused_queue.resume.set()
            taker_queue.resume.set()
        taken_over.result(30)

    assert _task_row(database_url, task_id)["status"] == "Completed"
    publish_outbox(container)
    events = _every_fanout_event(tap, role_id)
    assert Counter(e.key for e in events) == Counter(str(u) for u in users)  # nothing lost, nothing twice
    by_claim = Counter(e.body["correlationId"] for e in events)
    assert by_claim == {str(task.claim_id): 10, str(taker_queue.claim_id): 30}


def _wait_for_listener(database_url: str, timeout_s: float = 10.0) -> None:
    """Until the worker's wake-up connection has run LISTEN: it runs it only after a claim found nothing."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        wait_until(lambda: _listening(conn), "the worker got to LISTEN", timeout_s=timeout_s)


def _listening(conn: psycopg.Connection) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'pin-identity-fanout-listen' AND query ILIKE 'LISTEN %')"
    ).fetchone()
    return bool(row and row[0])


@contextmanager
def _idle_worker(stores: Stores, connections: Connections) -> Iterator[None]:
    """The fan-out job on a thread, with real wake-ups and a polling interval no test waits out (60 s)."""
    settings = FanOutSettings(polling_interval_s=60, batch_size=50)
    job = AccessFanOutJob(
        stores.fanout_queue, PostgresTaskWakeups(connections.database), settings, SYSTEM_CLOCK
    )
    stop = threading.Event()
    worker = threading.Thread(target=job.run, args=(stop,), daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join(10)


def _completes_within_10_s(database_url: str, task_id: UUID, why: str) -> None:
    enqueued = time.monotonic()
    wait_until(lambda: _task_row(database_url, task_id)["status"] == "Completed", why, timeout_s=10)
    assert time.monotonic() - enqueued < 10


def test_a_new_task_wakes_an_idle_worker_long_before_its_polling_interval(
    container: Container, connections: Connections, stores: Stores, database_url: str
) -> None:
    _, role_id, _ = seed.bulk_held_role(stores.identity_transactions, database_url, 20)
    with _idle_worker(stores, connections):
        _wait_for_listener(database_url)  # the worker found nothing and is now waiting on LISTEN
        task_id = _change_permissions(container, role_id)
        _completes_within_10_s(database_url, task_id, "the NOTIFY woke the worker and it completed the task")


def test_a_task_announced_while_the_listening_session_was_gone_is_found_once_it_reconnects(
    container: Container, connections: Connections, stores: Stores, database_url: str
) -> None:
    """A NOTIFY sent while nobody listened is lost (the server ended the session: a failover, a restart):
    the worker looks for a task as soon as it listens again, not at its next polling interval."""
    _, role_id, _ = seed.bulk_held_role(stores.identity_transactions, database_url, 20)
    with _idle_worker(stores, connections), psycopg.connect(database_url, autocommit=True) as conn:
        _wait_for_listener(database_url)
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'pin-identity-fanout-listen' AND datname = current_database()"
        )
        task_id = _change_permissions(container, role_id)  # announced to nobody: the listener is gone
        _completes_within_10_s(database_url, task_id, "the worker looked once it listened again")


def test_a_listen_connection_refused_waits_out_its_timeout_rather_than_asking_again_at_once(
    connections: Connections, database_url: str
) -> None:
    """While the server refuses connections (a failover), the worker's idle loop asks for a wake-up every
    half second: each failed LISTEN waits its timeout out, or the worker would reconnect in a busy loop."""
    away = Database(through_port(database_url, free_port()), limits=connections.database.limits)
    wakeups = PostgresTaskWakeups(away)
    started, tries = time.monotonic(), 0
    while time.monotonic() - started < 1.0:
        assert wakeups.wait(0.25) is False
        tries += 1
    assert tries <= 5, f"{tries} connection attempts in 1 s"


def test_the_page_writes_events_exactly_as_the_domain_renders_them(
    container: Container, stores: Stores, database_url: str
) -> None:
    """The fan-out's page renders and writes its events in SQL; they must say what the domain says."""
    company_id, role_id, users = seed.bulk_held_role(stores.identity_transactions, database_url, 3)
    seed.grant_in(
        stores.identity_transactions,
        users[0],
        seed.role(stores.identity_transactions, company_id, 'code "quoted" \\ кириллица %s 100%'),
        Scope(ScopeType.PROJECT, project_id=uuid.uuid4()),
        expires_at=datetime(2027, 3, 1, 9, 30, 15, 123456, tzinfo=UTC),
    )
    seed.grant_in(
        stores.identity_transactions,
        users[0],
        role_id,
        Scope(ScopeType.PROJECT_GROUP, project_group_id=uuid.uuid4()),
    )
    _change_permissions(container, role_id)
    occurred = datetime.now(UTC)
    task = stores.fanout_queue.claim(uuid.uuid4(), occurred, occurred + timedelta(minutes=5))
    assert task is not None
    common = {
        "reason": AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
        "version": 2,
        "changed_role_id": role_id,
        "correlation_id": task.claim_id,
        "occurred_at": occurred,
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    template = events.access_changed_template(**common)
    with stores.fanout_queue.batch(task, occurred, occurred + timedelta(minutes=5)) as batch:
        page = batch.write_page(role_id, None, 10, template)
        batch.commit()
    with psycopg.connect(database_url) as conn:
        written = conn.execute(
            "SELECT event_id, topic, message_key, event_type, correlation_id, traceparent, value"
            " FROM identity.outbox_events WHERE correlation_id = %s ORDER BY message_key",
            (task.claim_id,),
        ).fetchall()
    with stores.identity_transactions() as tx:
        domain = tx.access_snapshots(users)
    assert page == (len(users), max(users))
    expected = [events.user_access_changed(snapshot, **common) for snapshot in domain]
    assert [row[1:6] for row in written] == [
        (m.topic, m.key, m.event_type, m.correlation_id, m.traceparent) for m in expected
    ]
    from_sql = [json.loads(row[6]) for row in written]
    assert [body["eventId"] for body in from_sql] == [str(row[0]) for row in written]
    from_domain = [json.loads(m.value) for m in expected]
    for body in from_sql + from_domain:
        body.pop("eventId")
        validate_event({**body, "eventId": str(uuid.uuid4())})
    assert from_sql == from_domain
    assert len(from_sql[0]["payload"]["activeAssignments"]) == 3

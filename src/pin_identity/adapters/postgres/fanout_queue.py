"""The access fan-out queue on PostgreSQL: claims with SKIP LOCKED, fenced batches, LISTEN wake-ups."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import class_row, dict_row, kwargs_row, scalar_row

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import NIL_UUID, Database, Fence
from pin_identity.adapters.postgres.outbox_writer import template_params
from pin_identity.domain.errors import LeaseLostError
from pin_identity.domain.events import AccessChangeTemplate
from pin_identity.domain.lease import Release
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.operations.ports.fanout_tasks import (
    FanOutTask,
    FanOutTaskView,
    NewerAnnouncement,
    PageWritten,
    PoisonedTask,
    QueueStats,
    TaskReplay,
)


def _locked_page(row: tuple[Any, ...] | None) -> tuple[int, UUID | None, str | None]:
    """lock_fanout_page's one row, by position (the fan-out's hot loop): the page's size, its last user id
    and its ids as the text of a uuid[]. tests/integration/test_row_decoders.py holds the columns' order."""
    return row or (0, None, None)


class PostgresFanOutBatch:
    """One page's transaction on a connection in pipeline mode, waiting on two replies instead of six: the
    fence goes out with the page's lock, the page's events with the checkpoint and the commit. The fence's
    UPDATE holds the task's row until the commit, so once it answered, the checkpoint cannot miss the lease.
    """

    def __init__(
        self, conn: psycopg.Connection, task: FanOutTask, now: datetime, lease_until: datetime, fence: Fence
    ):
        self._conn, self._task, self._now, self._lease_until = conn, task, now, lease_until
        conn.execute(query("fanout_page_commits_without_flush"))
        self._fence, self._fence_reply = fence, fence.send(conn)
        self._advanced: psycopg.Cursor[Any] | None = None

    def write_page(
        self, role_id: UUID, after: UUID | None, size: int, template: AccessChangeTemplate
    ) -> PageWritten:
        params = {"role_id": role_id, "cursor": after or NIL_UUID, "limit": size}
        locked = self._conn.cursor(binary=True).execute(query("lock_fanout_page"), params)
        self._fence.check(self._fence_reply)  # the first read: the fence and the lock go out together
        page_size, last_user_id, user_ids = _locked_page(locked.fetchone())
        if page_size:
            params = {"user_ids": user_ids, **template_params(template)}
            self._conn.execute(query("write_access_changes"), params)  # answered with the commit
        return PageWritten(page_size, last_user_id)

    def advance(self, *, cursor: UUID | None, processed: int, completed: bool) -> None:
        params = {
            "task_id": self._task.task_id,
            "claim_id": self._task.claim_id,
            "cursor": cursor,
            "processed": processed,
            "completed": completed,
            "now": self._now,
            "lease_until": self._lease_until,
        }
        self._advanced = self._conn.execute(query("advance_fanout_task"), params)

    def commit(self) -> None:
        self._conn.commit()
        if self._advanced is not None and self._advanced.fetchone() is None:  # a broken fence, not a race
            raise LeaseLostError(str(self._task.task_id))


class PostgresFanOutQueue:
    """The tasks' leases (pin_identity.domain.lease has the rules; leases.sql the conditions the statements
    share with the import's pages)."""

    def __init__(self, database: Database):
        self._database = database

    def fail_exhausted(self, now: datetime, max_attempts: int) -> list[PoisonedTask]:
        params = {"now": now, "max_attempts": max_attempts}
        return self._database.fetch("fail_exhausted_fanout_tasks", params, class_row(PoisonedTask))

    def claim(self, claim_id: UUID, now: datetime, lease_until: datetime) -> FanOutTask | None:
        holder = self._database.holder_key()
        params = {"claim_id": claim_id, "now": now, "lease_until": lease_until, "holder": holder}
        row = self._database.fetch_one("claim_fanout_task", params, dict_row)
        return FanOutTask(**row, claim_id=claim_id) if row else None

    @contextmanager
    def batch(self, task: FanOutTask, now: datetime, lease_until: datetime) -> Iterator[PostgresFanOutBatch]:
        params = {
            "task_id": task.task_id,
            "claim_id": task.claim_id,
            "cursor": task.cursor,
            "now": now,
            "lease_until": lease_until,
        }
        # Locks the task row for the batch: the fence holds until commit.
        fence = Fence("renew_fanout_lease", params, task.task_id)
        with self._database.transaction() as conn, conn.pipeline():
            yield PostgresFanOutBatch(conn, task, now, lease_until, fence)

    def release(self, task: FanOutTask, now: datetime, release: Release) -> None:
        params = {
            "task_id": task.task_id,
            "claim_id": task.claim_id,
            "now": now,
            "available_at": release.available_at,
            "count_attempt": release.count_attempt,
            "error": release.error,
        }
        self._database.execute("release_fanout_task", params)

    def list_tasks(self, status: FanOutTaskStatus | None, limit: int = 100) -> list[FanOutTaskView]:
        params = {"status": status.value if status else None, "limit": limit}
        return self._database.fetch("list_fanout_tasks", params, kwargs_row(_task_view))

    def replay(self, task_id: UUID, now: datetime) -> TaskReplay:
        """A Failed task back to Pending with fresh attempts, from its cursor (the role's one Pending task
        is kept unique by an index: it notifies every user)."""
        try:
            replayed = self._database.execute("replay_fanout_task", {"task_id": task_id, "now": now})
        except psycopg.errors.UniqueViolation:
            return TaskReplay.ROLE_HAS_PENDING_TASK
        return TaskReplay.REPLAYED if replayed else TaskReplay.NOT_FAILED

    def discard(self, task_id: UUID) -> FanOutTaskView | None:
        return self._database.fetch_one("discard_fanout_task", {"task_id": task_id}, kwargs_row(_task_view))

    def task_status(self, task_id: UUID) -> FanOutTaskStatus | None:
        task = self._database.fetch_one("fanout_task_status", {"task_id": task_id}, dict_row)
        return FanOutTaskStatus(task["status"]) if task else None

    def newer_announcement(self, role_id: UUID, role_version: int) -> NewerAnnouncement:
        params = {"role_id": role_id, "role_version": role_version}
        row = self._database.fetch_one("newer_role_announcement", params, dict_row)
        assert row is not None  # one row, whatever the role has
        status = FanOutTaskStatus(row["task_status"]) if row["task_status"] else None
        return NewerAnnouncement(row["role_version"], row["task_id"], status, row["failed"])

    def stats(self, now: datetime) -> QueueStats:
        [stats] = self._database.fetch("fanout_queue_stats", {"now": now}, class_row(QueueStats))
        return stats

    def outbox_waiting(self, cap: int) -> int:
        [waiting] = self._database.fetch("outbox_waiting_estimate", {"cap": cap}, scalar_row)
        return int(waiting)


def _task_view(*, status: str, **columns: Any) -> FanOutTaskView:
    """A row of list_fanout_tasks, whose columns are named as the read model's fields."""
    return FanOutTaskView(status=FanOutTaskStatus(status), **columns)


class PostgresTaskWakeups:
    """LISTEN on a dedicated connection; set-role-permissions NOTIFYs at commit when it enqueues a task."""

    def __init__(self, database: Database):
        self._database = database
        self._conn: psycopg.Connection | None = None

    def wait(self, timeout_s: float) -> bool:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._database.dedicated(autocommit=True, name="pin-identity-fanout-listen")
                self._conn.execute(query("listen_fanout_tasks"))
                # What was announced while no session listened (a failover, a restart of the server) was
                # lost with it: the job looks for a task once now rather than at its next polling interval.
                return True
            return any(True for _ in self._conn.notifies(timeout=timeout_s, stop_after=1))
        except psycopg.Error:
            # Polling carries on without wake-ups until a later try reconnects. The timeout is waited out
            # here: a server that refuses connections at once would otherwise be asked again in a busy loop.
            self.close()
            time.sleep(timeout_s)
            return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

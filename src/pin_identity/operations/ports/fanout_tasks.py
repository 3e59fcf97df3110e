"""The access fan-out's task queue: the job claims a role's task and writes its users' events page by page
(FanOutQueue, FanOutBatch, TaskWakeups); operators list, replay and discard the tasks (FanOutTasks)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple, Protocol
from uuid import UUID

from pin_identity.domain.api_model import ApiModel
from pin_identity.domain.events import AccessChangeTemplate
from pin_identity.domain.lease import Release
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.operations.ports.transactions import Transaction


@dataclass(frozen=True)
class FanOutTask:
    """A claimed AccessFanOutTask; claim_id fences every write of this lease (the jobRunId of the claim), from
    the checkpoint (cursor, processed_count) the claim last left: as claimed, then as each batch advanced it.
    """

    task_id: UUID
    role_id: UUID
    company_id: UUID | None
    role_version: int
    cursor: UUID | None
    processed_count: int
    attempt: int
    created_at: datetime
    claim_id: UUID
    started_at: datetime  # StartedAt: the task's first claim, kept by every later one


@dataclass(frozen=True)
class PoisonedTask:
    task_id: UUID
    role_id: UUID
    attempts: int
    last_error: str | None


@dataclass(frozen=True)
class QueueStats:
    backlog: int  # Pending, InProgress with an expired lease, or waiting out a back-off
    failed: int


class PageWritten(NamedTuple):
    """A fan-out page as written: how many users it held, and the last one (the next cursor)."""

    size: int
    last_user_id: UUID | None


class FanOutBatch(Transaction, Protocol):
    """One batch's transaction; the lease was checked (and renewed) when it opened."""

    def write_page(
        self, role_id: UUID, after: UUID | None, size: int, template: AccessChangeTemplate
    ) -> PageWritten:
        """Locks the next page of the role's users (by id, after `after`, at most `size`) and writes each
        one's UserAccessChanged with their full snapshot from `template`."""
        ...

    def advance(self, *, cursor: UUID | None, processed: int, completed: bool) -> None: ...


class FanOutQueue(Protocol):
    """The tasks' leases, under the rules of pin_identity.domain.lease (as ImportStore's pages)."""

    def fail_exhausted(self, now: datetime, max_attempts: int) -> list[PoisonedTask]: ...
    def claim(self, claim_id: UUID, now: datetime, lease_until: datetime) -> FanOutTask | None: ...
    def batch(
        self, task: FanOutTask, now: datetime, lease_until: datetime
    ) -> AbstractContextManager[FanOutBatch]:
        """Opens the batch transaction; its first statement raises LeaseLostError when the lease is no longer
        this claim's, or the stored checkpoint is no longer `task.cursor` (the server lost pages)."""
        ...

    def release(self, task: FanOutTask, now: datetime, release: Release) -> None: ...
    def stats(self, now: datetime) -> QueueStats: ...
    def outbox_waiting(self, cap: int) -> int:
        """How many events wait in the outbox, counted up to `cap` (cheap: it counts no further)."""
        ...


class TaskWakeups(Protocol):
    def wait(self, timeout_s: float) -> bool:
        """Block until a new task is announced (True) or the timeout passes (False)."""
        ...

    def close(self) -> None: ...


class TaskReplay(StrEnum):
    """What asking for a fan-out task's replay did."""

    REPLAYED = "replayed"  # Failed -> Pending, AttemptCount 0
    NOT_FAILED = "not-failed"  # the task is in another status, or does not exist
    ROLE_HAS_PENDING_TASK = "role-has-pending-task"  # one Pending task per role: it notifies every user


@dataclass(frozen=True)
class NewerAnnouncement:
    """What a role announced after one of its tasks: its version now, and its newest task past that one's
    version that did not fail (None: none is left)."""

    role_version: int | None  # None: the role is gone
    task_id: UUID | None
    task_status: FanOutTaskStatus | None
    failed: bool  # a task of a newer version failed too


# A fan-out task as operators list it; the claimed task the job works on is ports.fanout_tasks.FanOutTask. Its
# OpenAPI schema keeps the name clients know, FanOutTask. (No docstring: it would become the schema's
# description.)
class FanOutTaskView(ApiModel, schema_name="FanOutTask"):
    task_id: UUID
    role_id: UUID
    company_id: UUID | None
    role_version: int
    reason: str
    status: FanOutTaskStatus
    cursor: UUID | None
    processed_count: int
    attempt_count: int
    lease_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    updated_at: datetime
    last_error: str | None


class FanOutTasks(Protocol):
    def list_tasks(self, status: FanOutTaskStatus | None, limit: int) -> list[FanOutTaskView]:
        """The newest first."""
        ...

    def replay(self, task_id: UUID, now: datetime) -> TaskReplay: ...
    def discard(self, task_id: UUID) -> FanOutTaskView | None:
        """Removes a Failed task; what it was, or None when the task is in another status or absent."""
        ...

    def task_status(self, task_id: UUID) -> FanOutTaskStatus | None: ...
    def newer_announcement(self, role_id: UUID, role_version: int) -> NewerAnnouncement: ...

"""The operator's side of the access fan-out queue: the tasks, the runbook's replay of a Failed one, and its
discard when the users past its cursor need it no more."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import ConflictError, NotFoundError
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.operations.action_log import Actor, admin_action
from pin_identity.operations.ports.fanout_tasks import (
    FanOutTasks,
    FanOutTaskView,
    NewerAnnouncement,
    TaskReplay,
)


class PastCursor(StrEnum):
    """Whether the users past a discarded task's cursor heard of their role since."""

    TOLD = "told"  # a newer task of the role completed, or a newer version was announced inline
    BEING_TOLD = "being-told"  # a newer task of the role is Pending or InProgress
    NEVER_TOLD = "never-told"  # nothing after the task told them: their caches may keep stale rights


@dataclass(frozen=True)
class TaskDiscard:
    """A discarded task, and what its discard checked of the users past its cursor."""

    task: FanOutTaskView
    past_cursor: PastCursor
    told_by: UUID | None  # the newer task that told them, or will
    detail: str

    @classmethod
    def judged(cls, task: FanOutTaskView, newer: NewerAnnouncement) -> TaskDiscard:
        cursor = f"past cursor {task.cursor}" if task.cursor else "of the role"
        if newer.task_status is FanOutTaskStatus.COMPLETED:
            detail = f"task {newer.task_id} of a newer version of the role completed: it told every holder"
            return cls(task, PastCursor.TOLD, newer.task_id, detail)
        if newer.task_id is not None:
            status = newer.task_status.value if newer.task_status else "waiting"
            detail = f"task {newer.task_id} of a newer version of the role is {status}: it will tell them"
            return cls(task, PastCursor.BEING_TOLD, newer.task_id, detail)
        if newer.role_version is not None and newer.role_version > task.role_version and not newer.failed:
            detail = f"the role is at version {newer.role_version}, announced inline to every holder"
            return cls(task, PastCursor.TOLD, None, detail)
        detail = (
            f"no newer change of the role told them: the users {cursor} were never told of version "
            f"{task.role_version} (re-announce it: roles set-permissions {task.role_id} <its current codes>)"
        )
        return cls(task, PastCursor.NEVER_TOLD, None, detail)


class FanOutAdmin:
    def __init__(self, tasks: FanOutTasks, clock: Clock):
        self._tasks, self._clock = tasks, clock

    def tasks(self, status: FanOutTaskStatus | None = None, limit: int = 100) -> list[FanOutTaskView]:
        """The newest first."""
        return self._tasks.list_tasks(status, limit)

    def replay(self, task_id: UUID, *, who: Actor) -> None:
        """After the cause is fixed: a Failed task goes back to Pending with AttemptCount = 0, from its
        cursor."""
        outcome = self._tasks.replay(task_id, self._clock.now())
        if outcome is TaskReplay.ROLE_HAS_PENDING_TASK:
            raise ConflictError(
                f"fan-out task {task_id}: its role already has a Pending task, which notifies every user"
            )
        if outcome is TaskReplay.NOT_FAILED:
            raise self._not_failed(task_id, "replayed")
        admin_action("fanout-replay", who, task_id=str(task_id))

    def discard(self, task_id: UUID, *, who: Actor) -> TaskDiscard:
        """The operator's decision that a Failed task is not to be replayed (a newer task of its role notified
        every holder, or they were re-announced): the task is deleted. Pruning never deletes a Failed task,
        so this is the only way one leaves the queue without being replayed; the audit line keeps what it
        was. The answer says whether the users past its cursor heard of the role since (a newer task
        completed or is on its way, a newer version was announced inline), or were never told."""
        discarded = self._tasks.discard(task_id)
        if discarded is None:
            raise self._not_failed(task_id, "discarded")
        judged = TaskDiscard.judged(
            discarded, self._tasks.newer_announcement(discarded.role_id, discarded.role_version)
        )
        admin_action(
            "fanout-discard",
            who,
            task_id=str(task_id),
            role_id=str(discarded.role_id),
            role_version=discarded.role_version,
            processed_count=discarded.processed_count,
            cursor=str(discarded.cursor) if discarded.cursor else None,
            users_past_cursor=judged.past_cursor.value,
            told_by=str(judged.told_by) if judged.told_by else None,
        )
        return judged

    def _not_failed(self, task_id: UUID, done: str) -> Exception:
        status = self._tasks.task_status(task_id)
        if status is None:
            return NotFoundError(f"fan-out task {task_id} does not exist")
        return ConflictError(f"fan-out task {task_id} is {status.value}, only a Failed task can be {done}")

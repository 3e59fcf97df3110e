"""The operator's side of the access fan-out queue: the tasks, the runbook's replay of a Failed one, and its
discard when the users past its cursor need it no more."""

from __future__ import annotations

from uuid import UUID

from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import ConflictError, NotFoundError
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.operations.action_log import Actor, admin_action
from pin_identity.operations.ports.fanout_tasks import FanOutTasks, TaskReplay
from pin_identity.operations.read_models import FanOutTask


class FanOutAdmin:
    def __init__(self, tasks: FanOutTasks, clock: Clock):
        self._tasks, self._clock = tasks, clock

    def tasks(self, status: FanOutTaskStatus | None = None, limit: int = 100) -> list[FanOutTask]:
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

    def discard(self, task_id: UUID, *, who: Actor) -> FanOutTask:
        """The operator's decision that a Failed task is not to be replayed (a newer task of its role notified
        every holder, or they were re-announced): the task is deleted. Pruning never deletes a Failed task,
        so this is the only way one leaves the queue without being replayed; the audit line keeps what it
        was."""
        discarded = self._tasks.discard(task_id)
        if discarded is None:
            raise self._not_failed(task_id, "discarded")
        admin_action(
            "fanout-discard",
            who,
            task_id=str(task_id),
            role_id=str(discarded.role_id),
            role_version=discarded.role_version,
            processed_count=discarded.processed_count,
            cursor=str(discarded.cursor) if discarded.cursor else None,
        )
        return discarded

    def _not_failed(self, task_id: UUID, done: str) -> Exception:
        status = self._tasks.task_status(task_id)
        if status is None:
            return NotFoundError(f"fan-out task {task_id} does not exist")
        return ConflictError(f"fan-out task {task_id} is {status.value}, only a Failed task can be {done}")

"""The operator's side of the access fan-out queue: the tasks, and the runbook's replay of a Failed one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from uuid import UUID

from pin_identity.domain.errors import ConflictError, NotFoundError
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.operations.audit import Actor, admin_action
from pin_identity.operations.ports.fanout import FanOutTasks, TaskReplay
from pin_identity.operations.read_models import FanOutTaskView


class FanOutAdmin:
    def __init__(self, tasks: FanOutTasks, clock: Callable[[], datetime]):
        self._tasks, self._clock = tasks, clock

    def tasks(self, status: FanOutTaskStatus | None = None, limit: int = 100) -> list[FanOutTaskView]:
        """The newest first."""
        return self._tasks.list_tasks(status, limit)

    def replay(self, task_id: UUID, *, who: Actor) -> None:
        """After the cause is fixed: a Failed task goes back to Pending with AttemptCount = 0, from its
        cursor."""
        outcome = self._tasks.replay(task_id, self._clock())
        if outcome is TaskReplay.ROLE_HAS_PENDING_TASK:
            raise ConflictError(
                f"fan-out task {task_id}: its role already has a Pending task, which notifies every user"
            )
        if outcome is TaskReplay.NOT_FAILED:
            status = self._tasks.task_status(task_id)
            if status is None:
                raise NotFoundError(f"fan-out task {task_id} does not exist")
            raise ConflictError(
                f"fan-out task {task_id} is {status.value}, only a Failed task can be replayed"
            )
        admin_action("fanout-replay", who, task_id=str(task_id))

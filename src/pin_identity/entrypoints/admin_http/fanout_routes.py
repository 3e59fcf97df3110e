"""`/admin/v1/access-fanout`: the fan-out tasks, and the runbook's replay or discard of a Failed one."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.entrypoints.admin_http.problems import problem_responses
from pin_identity.entrypoints.admin_http.routing import ContainerDep, TaskId, Who, admin_router
from pin_identity.entrypoints.documents import TaskDiscarded, TaskReplayed
from pin_identity.operations.ports.fanout_tasks import FanOutTaskView

fanout = admin_router("/admin/v1/access-fanout", "access-fanout")


@fanout.get("/tasks", response_model=list[FanOutTaskView])
def list_fanout_tasks(
    container: ContainerDep,
    status: Annotated[FanOutTaskStatus | None, Query(description="Only tasks in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> list[FanOutTaskView]:
    """The newest fan-out tasks first."""
    return container.use_cases.fanout_admin.tasks(status, limit)


@fanout.post("/tasks/{taskId}/replay", response_model=TaskReplayed, responses=problem_responses(404, 409))
def replay_fanout_task(task_id: TaskId, container: ContainerDep, who: Who) -> TaskReplayed:
    """The runbook's replay: a Failed task goes back to Pending with AttemptCount = 0, from its cursor."""
    container.use_cases.fanout_admin.replay(task_id, who=who)
    return TaskReplayed(task_id=task_id, status=FanOutTaskStatus.PENDING)


@fanout.post("/tasks/{taskId}/discard", response_model=TaskDiscarded, responses=problem_responses(404, 409))
def discard_fanout_task(task_id: TaskId, container: ContainerDep, who: Who) -> TaskDiscarded:
    """The runbook's discard: a Failed task that is not to be replayed (a newer task of its role notified
    every holder, or they were re-announced) is deleted, and no longer counts as failed. `maintenance prune`
    never deletes a Failed task."""
    return TaskDiscarded.of(container.use_cases.fanout_admin.discard(task_id, who=who))

"""Pruning keeps what can still be replayed. A Failed fan-out task is the only record that the users past its
cursor never got their event: `maintenance prune` leaves it, however old, until an operator replays it or
discards it. A discard removes the task (audited with what it was) and the failed-task gauge falls with it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from psycopg.rows import dict_row
from structlog.testing import capture_logs

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.domain.errors import ConflictError, NotFoundError
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.observability.logging import AUDIT_EVENT
from pin_identity.operations.action_log import Actor
from tests.support import seed

WHO = Actor("cli:ops")
LONG_AGO = timedelta(days=400)


def _task(container: Container, status: FanOutTaskStatus, *, processed: int = 0) -> UUID:
    """A queued task of a role of two users, put in `status` as the job leaves it, and older than any
    retention."""
    _, role_id = seed.held_role(container.stores.identity_transactions, 2)
    change = seed.change_permissions(
        container.stores.identity_transactions, role_id, ["deals.read"], FanOutPolicy(0)
    )
    assert change.task_id is not None
    finished = status is FanOutTaskStatus.COMPLETED
    with container.connections.database.connection() as conn:
        conn.execute(
            "UPDATE identity.access_fanout_tasks SET status = %(status)s, processed_count = %(processed)s,"
            " attempt_count = 5, created_at = %(then)s, updated_at = %(then)s,"
            " completed_at = CASE WHEN %(finished)s THEN %(then)s END WHERE id = %(id)s",
            {
                "status": status.value,
                "processed": processed,
                "then": SYSTEM_CLOCK.now() - LONG_AGO,
                "finished": finished,
                "id": change.task_id,
            },
        )
        conn.commit()
    return change.task_id


def _row(container: Container, task_id: UUID) -> dict[str, Any] | None:
    with container.connections.database.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT status, attempt_count FROM identity.access_fanout_tasks WHERE id = %s", [task_id]
        ).fetchone()


def _failed_gauge(container: Container) -> int:
    return container.stores.fanout_queue.stats(SYSTEM_CLOCK.now()).failed


def test_prune_keeps_a_failed_task_however_old_and_it_can_still_be_replayed(container: Container) -> None:
    completed = _task(container, FanOutTaskStatus.COMPLETED)
    failed = _task(container, FanOutTaskStatus.FAILED, processed=1)

    pruned = container.use_cases.retention.prune(timedelta(0), who=WHO)

    assert pruned.fanout_tasks == 1
    assert _row(container, completed) is None
    assert _row(container, failed) == {"status": "Failed", "attempt_count": 5}
    assert _failed_gauge(container) == 1, "the failed-task alert stays until someone acts"
    container.use_cases.fanout_admin.replay(failed, who=WHO)
    assert _row(container, failed) == {"status": "Pending", "attempt_count": 0}


def test_a_discarded_task_is_gone_audited_with_what_it_was_and_no_longer_counts_as_failed(
    container: Container,
) -> None:
    failed = _task(container, FanOutTaskStatus.FAILED, processed=1)
    assert _failed_gauge(container) == 1

    with capture_logs() as logs:
        discarded = container.use_cases.fanout_admin.discard(failed, who=WHO).task

    assert (discarded.task_id, discarded.processed_count) == (failed, 1)
    assert _row(container, failed) is None
    assert _failed_gauge(container) == 0
    [audit] = [line for line in logs if line["event"] == AUDIT_EVENT]
    assert (audit["action"], audit["who"], audit["task_id"]) == ("fanout-discard", "cli:ops", str(failed))
    assert (audit["role_id"], audit["role_version"], audit["processed_count"]) == (
        str(discarded.role_id),
        discarded.role_version,
        1,
    )


@pytest.mark.parametrize("status", [FanOutTaskStatus.PENDING, FanOutTaskStatus.COMPLETED])
def test_only_a_failed_task_can_be_discarded(container: Container, status: FanOutTaskStatus) -> None:
    task_id = _task(container, status)
    with capture_logs() as logs, pytest.raises(ConflictError, match="only a Failed task can be discarded"):
        container.use_cases.fanout_admin.discard(task_id, who=WHO)
    assert _row(container, task_id) is not None
    assert [line for line in logs if line["event"] == AUDIT_EVENT] == []


def test_an_unknown_task_is_not_found(container: Container) -> None:
    with pytest.raises(NotFoundError):
        container.use_cases.fanout_admin.discard(UUID(int=7), who=WHO)

"""A discard of a Failed fan-out task checks whether the users past its cursor heard of the role since: a
newer task of the role completed (told), is on its way (being told), a newer version was announced inline
(told), or nothing told them (never told), which the answer and the audit line say."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from structlog.testing import capture_logs

from pin_identity.composition import Container
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.operations.action_log import Actor
from tests.support import seed

WHO = Actor("cli:test")


def _failed_task(container: Container, database_url: str, role_id: uuid.UUID) -> uuid.UUID:
    """The role's permissions changed, queued, and the task failed half-way (MaxAttempts reached)."""
    change = seed.change_permissions(
        container.stores.identity_transactions, role_id, [f"p.{uuid.uuid4().hex[:6]}"], FanOutPolicy(0)
    )
    assert change.task_id is not None
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE identity.access_fanout_tasks SET status = 'Failed', attempt_count = 5,"
            " processed_count = 1, cursor = gen_random_uuid() WHERE id = %s",
            [change.task_id],
        )
    return change.task_id


def _newer_task(container: Container, database_url: str, role_id: uuid.UUID, status: str) -> uuid.UUID:
    change = seed.change_permissions(
        container.stores.identity_transactions, role_id, [f"q.{uuid.uuid4().hex[:6]}"], FanOutPolicy(0)
    )
    assert change.task_id is not None
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE identity.access_fanout_tasks SET status = %s WHERE id = %s", [status, change.task_id]
        )
    return change.task_id


@pytest.mark.parametrize(
    ("newer", "past_cursor"),
    [
        ("Completed", "told"),
        ("Pending", "being-told"),
        ("inline", "told"),
        ("Failed", "never-told"),
        (None, "never-told"),
    ],
)
def test_a_discard_says_whether_the_users_past_the_cursor_were_told(
    container: Container, database_url: str, newer: str | None, past_cursor: str
) -> None:
    _, role_id = seed.held_role(container.stores.identity_transactions, holders=3)
    failed = _failed_task(container, database_url, role_id)
    told_by = None
    if newer == "inline":
        seed.change_permissions(container.stores.identity_transactions, role_id, ["r"], FanOutPolicy(200))
    elif newer is not None:
        told_by = _newer_task(container, database_url, role_id, newer)

    with capture_logs() as logs:
        discarded = container.use_cases.fanout_admin.discard(failed, who=WHO)

    assert discarded.task.task_id == failed
    assert discarded.past_cursor.value == past_cursor
    assert discarded.told_by == (told_by if past_cursor != "never-told" else None)
    if past_cursor == "never-told":
        assert "were never told" in discarded.detail
    [audit] = [line for line in logs if line.get("action") == "fanout-discard"]
    assert audit["users_past_cursor"] == past_cursor

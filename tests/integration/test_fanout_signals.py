"""What the fan-out tells operators, read where the spec puts it: the queue's backlog counts every task not
done (a task waiting out a back-off after a failed attempt too), and the size of each announcement is
observed whichever path it took (inline or a task)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY

from pin_identity.composition.stores import Stores
from pin_identity.domain.fanout_policy import FanOutPath, FanOutPolicy
from pin_identity.domain.lease import Release
from tests.support import seed


def test_a_task_waiting_out_a_back_off_counts_in_the_backlog(stores: Stores) -> None:
    _, role = seed.held_role(stores.identity_transactions, holders=2)
    assert (
        seed.change_permissions(stores.identity_transactions, role, ["a"], FanOutPolicy(0)).path
        is FanOutPath.QUEUED
    )
    queue, now = stores.fanout_queue, datetime.now(UTC)
    assert queue.stats(now).backlog == 1  # Pending
    task = queue.claim(uuid.uuid4(), now, now + timedelta(minutes=5))
    assert task is not None
    assert queue.stats(now).backlog == 0  # a live lease: a worker is on it

    queue.release(task, now, Release(now + timedelta(minutes=1), count_attempt=True, error="database gone"))

    # Nobody works on it until its back-off ends, and it is not done: it waits in the queue.
    assert queue.stats(now + timedelta(seconds=1)).backlog == 1
    assert queue.stats(now + timedelta(minutes=2)).backlog == 1


def _size() -> tuple[float, float]:
    count = REGISTRY.get_sample_value("identity_access_fanout_size_count") or 0.0
    total = REGISTRY.get_sample_value("identity_access_fanout_size_sum") or 0.0
    return count, total


def test_an_inline_announcement_is_observed_in_the_fan_out_size(stores: Stores) -> None:
    _, role = seed.held_role(stores.identity_transactions, holders=3)
    before = _size()

    change = seed.change_permissions(stores.identity_transactions, role, ["a", "b"], FanOutPolicy(200))

    assert (change.path, change.users_notified_inline) == (FanOutPath.INLINE, 3)
    count, total = _size()
    assert (count - before[0], total - before[1]) == (1, 3)

"""The worker as a separate process over a 20,000-user role, killed with SIGKILL at random moments."""

from __future__ import annotations

import functools
import random
import signal
import subprocess
import sys
from collections import Counter

import pytest

from pin_identity.composition.stores import Stores
from pin_identity.domain.fanout_policy import FanOutPolicy
from tests.support import seed
from tests.support.fanout import task_progress
from tests.support.kafka_tap import ConsumedEvent, EventTap
from tests.support.relay import outbox_count
from tests.support.waiting import holds_within, wait_until

USERS = 20_000
KILLS = 5
LEASE_S = 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_at_random_moments_loses_no_user(
    stores: Stores, database_url: str, subprocess_env: dict[str, str], tap: EventTap
) -> None:
    _, role_id, users = seed.bulk_held_role(stores.identity_transactions, database_url, USERS)
    seed.change_permissions(stores.identity_transactions, role_id, ["x"], FanOutPolicy(inline_threshold=0))
    env = {
        **subprocess_env,
        "PIN_IDENTITY_FANOUT_BATCH_SIZE": "50",
        "PIN_IDENTITY_FANOUT_MAX_LEASE_S": str(LEASE_S),  # a killed worker's lease frees quickly
        "PIN_IDENTITY_FANOUT_POLLING_INTERVAL_S": "0.2",
    }
    command = [
        sys.executable,
        "-m",
        "pin_identity.entrypoints.cli",
        "worker",
        "--jobs",
        "access-fanout,outbox-relay",
    ]
    rng = random.Random(20261129)
    kills = 0
    received: Counter[str] = Counter()

    def ours(event: ConsumedEvent) -> bool:
        return (
            event.payload.get("changedRoleId") == str(role_id)
            and event.payload.get("changeReason") == "RolePermissionsChanged"
        )

    def progressed_to(target: int) -> bool:
        """Whether the task's progress reached `target`; if not, what was published meanwhile is read."""
        if task_progress(database_url)[1] >= target:
            return True
        tap.poll(0.05)
        received.clear()
        received.update(e.key for e in tap.received if ours(e))
        return False

    while kills < KILLS:
        worker = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        # Kill at a random point of the progress, so every kill lands mid-stream (batches in flight,
        # events in the outbox and in the producer).
        target = task_progress(database_url)[1] + rng.randint(200, 2500)
        holds_within(functools.partial(progressed_to, target), 60, every_s=0)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        kills += 1
        assert task_progress(database_url)[0] != "Completed", (
            "make the role bigger: a kill must land mid-stream"
        )

    finisher = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    try:
        # The task done and the outbox drained: every event is acknowledged, so below the topic's end.
        wait_until(
            lambda: task_progress(database_url)[0] == "Completed" and outbox_count(database_url) == 0,
            "the finisher completes the task and publishes every event",
            timeout_s=120,
        )
        received = Counter(e.key for e in tap.read_to_end(ours))
    finally:
        finisher.send_signal(signal.SIGTERM)
        assert finisher.wait(timeout=60) == 0

    assert set(received) == {str(u) for u in users}, f"lost {USERS - len(received)} users"
    assert max(received.values()) <= 1 + KILLS
    assert task_progress(database_url) == ("Completed", USERS)
    duplicates = sum(count - 1 for count in received.values())
    print(f"{KILLS} kills: {USERS} users, {duplicates} duplicate events, max copies {max(received.values())}")

"""A claim's holder is alive while its database session is: a worker killed mid-task has its task taken over
at once, not when the lease (five minutes by default) runs out. A holder whose session dropped while it lives
(a network blip) has its claim taken over and is fenced when it writes again, fan-out tasks and import pages
alike (test_lease_rules.py); a live holder keeps its lease (its pause past a short lease is fenced by the
lease: test_access_fanout.py, test_a_paused_worker_whose_lease_expired_cannot_commit)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import psycopg
import pytest

from pin_identity.composition.stores import Stores
from pin_identity.domain.fanout_policy import FanOutPolicy
from tests.support import seed
from tests.support.fanout import task_progress
from tests.support.waiting import wait_until

USERS = 20_000
TAKEN_OVER_WITHIN_S = 30


def _events_per_user(database_url: str, role_id: uuid.UUID) -> Counter[str]:
    with psycopg.connect(database_url) as conn:
        keys = conn.execute(
            """SELECT message_key FROM identity.outbox_events
               WHERE value::jsonb -> 'payload' ->> 'changedRoleId' = %s""",
            (str(role_id),),
        ).fetchall()
    return Counter(key for (key,) in keys)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_mid_task_has_its_task_taken_over_at_once_with_the_default_lease(
    stores: Stores, database_url: str, subprocess_env: dict[str, str]
) -> None:
    _, role_id, users = seed.bulk_held_role(stores.identity_transactions, database_url, USERS)
    seed.change_permissions(stores.identity_transactions, role_id, ["x"], FanOutPolicy(inline_threshold=0))
    env = {  # the default lease: 300 s. No relay: the events stay in the outbox, counted there.
        **subprocess_env,
        "PIN_IDENTITY_FANOUT_BATCH_SIZE": "100",
        "PIN_IDENTITY_FANOUT_OUTBOX_BACKLOG_LIMIT": "0",
    }
    command = [sys.executable, "-m", "pin_identity.entrypoints.cli", "worker", "--jobs", "access-fanout"]

    first = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    try:
        wait_until(
            lambda: task_progress(database_url)[1] >= USERS // 4, "the first worker is a quarter through"
        )
    finally:
        first.send_signal(signal.SIGKILL)  # an OOM kill: no stop, no release
        first.wait()
    killed_at, processed_at_kill = time.monotonic(), task_progress(database_url)[1]
    second = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    try:
        wait_until(
            lambda: task_progress(database_url)[0] == "Completed",
            "another worker takes the task over and completes it",
            timeout_s=TAKEN_OVER_WITHIN_S,
        )
        completed_after_s = time.monotonic() - killed_at
    finally:
        second.terminate()
        second.wait(30)

    told = _events_per_user(database_url, role_id)
    print(
        f"killed at {processed_at_kill} of {USERS} users; completed {completed_after_s:.1f} s after the kill"
    )
    assert processed_at_kill < USERS
    assert set(told) == {str(user) for user in users}
    assert set(told.values()) == {1}  # the dead claim's page in flight was rolled back, not written twice

"""A claim's holder is alive while its database session is: a worker killed mid-task has its task taken over
at once, not when the lease (five minutes by default) runs out; a holder whose session dropped while it lives
(a network blip) has its claim taken over and is fenced when it writes again; a live holder keeps its lease
(its pause past a short lease is fenced by the lease: test_access_fanout.py,
test_a_paused_worker_whose_lease_expired_cannot_commit)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from pin_identity.adapters.postgres.holder_session import HOLDER_LOCK_SPACE
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.composition.stores import Stores
from pin_identity.config import Settings
from pin_identity.domain.errors import LeaseLostError
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


_HOLDER_LOCK = """FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND classid = %s::bigint::oid
                   AND objid = %s::bigint::oid"""


def _end_holder_session(database_url: str, key: int) -> None:
    """The holder's session ends under it (a network blip, a failover of the path): its lock goes with it,
    once its backend has exited."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        lock = (HOLDER_LOCK_SPACE, key)
        [(ended,)] = conn.execute(f"SELECT count(pg_terminate_backend(pid)) {_HOLDER_LOCK}", lock).fetchall()
        assert ended == 1
        wait_until(lambda: not conn.execute(f"SELECT 1 {_HOLDER_LOCK}", lock).fetchall(), "the lock is gone")


@pytest.fixture
def second_worker(settings: Settings) -> Iterator[Container]:
    """Another worker process's stores: its own pool, its own holder session."""
    other = Container(settings)
    yield other
    other.close()


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


def test_a_fanout_holder_whose_session_dropped_is_taken_over_and_fenced(
    container: Container, stores: Stores, second_worker: Container, database_url: str
) -> None:
    _, role_id, _ = seed.bulk_held_role(stores.identity_transactions, database_url, 40)
    seed.change_permissions(stores.identity_transactions, role_id, ["x"], FanOutPolicy(inline_threshold=0))
    now = SYSTEM_CLOCK.now()
    lease_until = now + timedelta(seconds=300)
    task = stores.fanout_queue.claim(uuid.uuid4(), now, lease_until)
    assert task is not None
    other = second_worker.stores.fanout_queue
    assert other.claim(uuid.uuid4(), now, lease_until) is None  # a live holder keeps its lease

    _end_holder_session(database_url, container.connections.database.holder_key())
    taken = other.claim(uuid.uuid4(), now, lease_until)

    assert taken is not None and taken.task_id == task.task_id
    with pytest.raises(LeaseLostError), stores.fanout_queue.batch(task, now, lease_until) as batch:
        batch.advance(cursor=None, processed=0, completed=False)
        batch.commit()
    assert stores.fanout_queue.claim(uuid.uuid4(), now, lease_until) is None  # a new session, a live claim


def _running_import_page(database_url: str) -> uuid.UUID:
    run_id = uuid.uuid4()
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO identity.talent_import_runs (id, mode, correlation_id) VALUES (%s, 'ApiPull', %s)",
            (run_id, uuid.uuid4()),
        )
        conn.execute(
            """INSERT INTO identity.talent_import_pages (id, run_id, stage, page_no)
               VALUES (%s, %s, 'Tenants', 0)""",
            (uuid.uuid4(), run_id),
        )
    return run_id


def test_an_import_page_holder_whose_session_ended_is_taken_over_and_fenced(
    container: Container, stores: Stores, second_worker: Container, database_url: str
) -> None:
    run_id = _running_import_page(database_url)
    now = SYSTEM_CLOCK.now()
    lease_until = now + timedelta(seconds=600)
    page = stores.import_store.claim_page(uuid.uuid4(), now, lease_until, 5, run_id)
    assert page is not None
    other = second_worker.stores.import_store
    assert other.claim_page(uuid.uuid4(), now, lease_until, 5, run_id) is None  # a live holder keeps it

    _end_holder_session(database_url, container.connections.database.holder_key())
    taken = other.claim_page(uuid.uuid4(), now, lease_until, 5, run_id)

    assert taken is not None and taken.page_id == page.page_id
    with pytest.raises(LeaseLostError), stores.import_store.page_transaction(page, now, lease_until):
        pass

"""`worker --once` as a cron-style deployment runs it: the process works until nothing is pending for any
of its jobs, so the relay publishes what the fan-out of the same process wrote."""

from __future__ import annotations

import subprocess

import psycopg

from pin_identity.composition.stores import Stores
from pin_identity.domain.fanout_policy import FanOutPath, FanOutPolicy
from tests.support import seed
from tests.support.cli import CLI
from tests.support.kafka_tap import EventTap


def test_two_once_workers_publish_every_event_of_three_queued_roles(
    stores: Stores, subprocess_env: dict[str, str], tap: EventTap, database_url: str
) -> None:
    company = seed.company(stores.identity_transactions)
    members: set[str] = set()
    for n in range(3):
        role = seed.role(stores.identity_transactions, company, code=f"role-{n}")
        members |= {str(u) for u in seed.bulk_role_members(database_url, role, company, 1500)}
        change = seed.change_permissions(
            stores.identity_transactions, role, ["deals.read", f"deals.write.{n}"], FanOutPolicy(0)
        )
        assert change.path is FanOutPath.QUEUED

    args = [*CLI, "worker", "--jobs", "access-fanout,outbox-relay", "--once"]
    workers = [
        subprocess.Popen(args, env=subprocess_env, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0, stderr[-2000:]

    with psycopg.connect(database_url) as conn:
        outbox = conn.execute("SELECT count(*) FROM identity.outbox_events").fetchone()
        tasks = conn.execute(
            "SELECT status, count(*) FROM identity.access_fanout_tasks GROUP BY 1"
        ).fetchall()
    assert outbox == (0,)
    assert tasks == [("Completed", 3)]
    events = tap.wait_for(lambda e: e.key in members, 4500, timeout_s=60)
    assert {event.key for event in events} == members

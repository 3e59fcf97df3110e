"""A point change's latency while a large fan-out runs: its commit -> its event's record timestamp.

    .venv/bin/python bench/point_change.py [--users 300000] [--changes 40] [--every-ms 200] [--runs 3]

Starts its own embedded PostgreSQL and broker (bench_brokers.py), seeds a role held by `--users` users
(bench_database.seed_role), starts the product's workers as bench/access_fanout.py does, and changes the
role's permissions: the fan-out. Once its first page has committed, it revokes one assignment of a holder
chosen at random every `--every-ms` through the use case (`identity_changes.revoke_role_assignment`: the
user's lock, the next assignment version, a UserAccessChanged in the outbox, the commit), `--changes` times.

For each revoke: the wall clock right after its commit returned, and the timestamp of the user's RoleRevoked
record on the access topic (CreateTime: the relay's produce). Counted are the revokes whose commit came
before the fan-out's task completed; the others are reported apart. The point change's events wait behind
every fan-out event already in the outbox (the relay publishes in outbox order, one event of a key in
flight), so this measures how far the relay trails the fan-out, plus the relay's own produce.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import datetime
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, TopicPartition

from access_fanout import change_permissions, start_workers, wait_until_published
from bench_brokers import PUBLISHED_PARTITIONS, bench_broker, ensure_published_topics
from bench_database import embedded_postgres, fresh_database, scratch_dir, seed_role
from bench_report import percentile
from pin_identity.adapters.postgres.database import ConnectionLimits, Database
from pin_identity.adapters.postgres.identity_store import PostgresIdentityTransactions
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context


def _holders(url: str, role_id: uuid.UUID, count: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(assignment id, user id) of `count` holders of the role, at random, one assignment each."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT DISTINCT ON (user_id) id, user_id FROM identity.role_assignments"
            " WHERE role_id = %s AND status = 'Active'"
            " AND user_id IN (SELECT user_id FROM identity.role_assignments WHERE role_id = %s"
            "                 ORDER BY random() LIMIT %s)",
            (role_id, role_id, count * 2),
        ).fetchall()
    return [(assignment_id, user_id) for assignment_id, user_id in rows][:count]


def _task_state(conn: psycopg.Connection) -> tuple[bool, bool]:
    """Whether the fan-out's first page has committed, and whether its task has completed."""
    row = conn.execute(
        "SELECT bool_or(processed_count > 0), bool_and(status = 'Completed')"
        " FROM identity.access_fanout_tasks"
    ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


def _revoke_during_fanout(
    url: str, revokes: list[tuple[uuid.UUID, uuid.UUID]], every_s: float
) -> dict[uuid.UUID, tuple[float, bool]]:
    """Each revoked user's commit time (epoch seconds) and whether the fan-out still ran then."""
    database = Database(url, limits=ConnectionLimits()).open()
    transactions = PostgresIdentityTransactions(database)
    committed: dict[uuid.UUID, tuple[float, bool]] = {}
    try:
        with psycopg.connect(url, autocommit=True) as watch:
            while not _task_state(watch)[0]:
                time.sleep(0.01)
            for assignment_id, user_id in revokes:
                identity_changes.revoke_role_assignment(
                    transactions, Context.fresh(SYSTEM_CLOCK), assignment_id
                )
                at = time.time()
                committed[user_id] = (at, not _task_state(watch)[1])
                time.sleep(every_s)
    finally:
        database.close()
    return committed


def _record_times(bootstrap: str, users: set[str]) -> dict[str, float]:
    """The timestamp (epoch seconds) of each user's RoleRevoked record on the access topic."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-point-change", "enable.auto.commit": False}
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(ACCESS_TOPIC, p))[1]
            for p in range(PUBLISHED_PARTITIONS)
        }
        consumer.assign([TopicPartition(ACCESS_TOPIC, p, 0) for p in range(PUBLISHED_PARTITIONS)])
        found: dict[str, float] = {}
        # Until every partition's position reaches its end: the last offsets are the transactions' markers,
        # which no message carries.
        while any(
            p.offset < ends[p.partition]
            for p in consumer.position(consumer.assignment())
            if ends[p.partition]
        ):
            for message in consumer.consume(10_000, timeout=1.0):
                key = (message.key() or b"").decode()
                if key in users and b'"changeReason":"RoleRevoked"' in (message.value() or b""):
                    found[key] = message.timestamp()[1] / 1000
        return found
    finally:
        consumer.close()


def run_once(
    admin_url: str, bootstrap: str, workdir: Path, args: argparse.Namespace, run: int
) -> list[float]:
    url = fresh_database(admin_url, f"bench_point_{run}")
    role_id = seed_role(url, args.users)
    revokes = _holders(url, role_id, args.changes)
    workers = start_workers(url, bootstrap, workdir, f"point-{run}")
    try:
        database = Database(url, limits=ConnectionLimits()).open()
        try:
            change_permissions(database, role_id, ["deals.read", "deals.approve"])
        finally:
            database.close()
        committed = _revoke_during_fanout(url, revokes, args.every_ms / 1000)
        wait_until_published(url, timeout_s=600)
    finally:
        workers.stop()
    recorded = _record_times(bootstrap, {str(user_id) for user_id in committed})
    during = [(recorded[str(u)] - at) * 1000 for u, (at, running) in committed.items() if running]
    after = [(recorded[str(u)] - at) * 1000 for u, (at, running) in committed.items() if not running]
    print(f"run {run + 1}, in commit order (ms): {' '.join(f'{ms:.0f}' for ms in during + after)}")
    print(
        f"run {run + 1}: {len(during)} revokes while the fan-out ran: {_summary(during)}; "
        f"{len(after)} after it completed: {_summary(after)}",
        flush=True,
    )
    return during


def _summary(latencies_ms: list[float]) -> str:
    if not latencies_ms:
        return "none"
    p50, p99 = statistics.median(latencies_ms), percentile(latencies_ms, 0.99)
    return f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {max(latencies_ms):.0f} ms"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=300_000)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--every-ms", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with (
        scratch_dir("bench-point-") as workdir,
        embedded_postgres(workdir) as admin_url,
        bench_broker(workdir) as broker,
    ):
        ensure_published_topics(broker)
        print(f"{datetime.now():%Y-%m-%d %H:%M}; broker: {broker.name}; users: {args.users:,}")
        latencies = [
            ms for run in range(args.runs) for ms in run_once(admin_url, broker.bootstrap, workdir, args, run)
        ]
        print(f"all runs, while the fan-out ran: {_summary(latencies)} (target: <= 200 ms)")


if __name__ == "__main__":
    main()

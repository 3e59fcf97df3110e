"""`access show` on an access topic of 1,000,000 users: how long one user's answer takes.

    .venv/bin/python bench/access_show.py [--users 1000000] [--partitions 12] [--runs 5]
    BENCH_KAFKA_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python bench/access_show.py    # a broker of your own

Starts its own embedded PostgreSQL (durable defaults) in a temporary directory, and a broker
(bench_brokers.py: Apache Kafka, or one BENCH_KAFKA_BOOTSTRAP names; there pin.identity.access.v1 must not
exist yet): the benchmark creates it (compacted, `--partitions`, as `kafka ensure-topics` does) and fills it.

The fill: `--users` users, each holding one role in their company (a third also a second role), written to
the database by COPY, and each user's UserAccessChanged rendered by the product (domain/events.py) and
produced once with the relay's producer settings and headers: one event per user, a topic of as many records
as users. Then, for users at three depths of their partition (the last user produced: the newest record
of its partition; the middle one; the first one: its partition's oldest record, the search's worst case),
each timing is
- `access show` in process: `Container.access_show(user)` on a container made for the run (a new
  consumer each call, as the command has: metadata, watermarks, the reads, the database's snapshot);
- `pin-identity access show USER --json` as a process: what an operator waits for, interpreter start and
  imports included.
Every answer must say `matching` (the database and the topic were filled from the same values).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from bench_brokers import bench_broker
from bench_database import (
    BulkAssignment,
    bulk_company,
    copy_assignments,
    copy_users,
    embedded_postgres,
    fresh_database,
    scratch_dir,
)
from bench_report import machine_line
from pin_identity.adapters.kafka.partitioning import key_partition
from pin_identity.adapters.kafka.publisher import producer_config
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain import events
from pin_identity.domain.model import AccessChangeReason, ActiveAssignment, Scope, UserAccessSnapshot

CLI = [sys.executable, "-m", "pin_identity.entrypoints.cli", "access", "show"]
CHUNK = 20_000
DEPTHS = ("newest", "middle", "oldest")


@dataclass(frozen=True)
class Roles:
    company_id: uuid.UUID
    main: uuid.UUID
    second: uuid.UUID


def create_topic(bootstrap: str, partitions: int) -> None:
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15).topics
    if events.ACCESS_TOPIC in topics:
        sys.exit(f"{events.ACCESS_TOPIC} exists on {bootstrap}: the benchmark fills a fresh one")
    ensure_topics({"bootstrap.servers": bootstrap}, (events.ACCESS_TOPIC,), TopicLayout(partitions, 1))


def seed_roles(conn: psycopg.Connection) -> Roles:
    with conn.cursor() as cur:
        company_id, (main, second) = bulk_company(cur, "Bench", ("sales-manager", "chessboard-viewer"))
    return Roles(company_id, main, second)


def snapshot_of(user_id: uuid.UUID, roles: Roles, index: int) -> UserAccessSnapshot:
    scope = Scope.organization(roles.company_id)
    held = [ActiveAssignment(uuid.uuid4(), roles.main, "sales-manager", scope, None)]
    if index % 3 == 0:
        held.append(ActiveAssignment(uuid.uuid4(), roles.second, "chessboard-viewer", scope, None))
    return UserAccessSnapshot(user_id, roles.company_id, tuple(held))


def write_users(conn: psycopg.Connection, snapshots: list[UserAccessSnapshot], company_id: uuid.UUID) -> None:
    """The users of the snapshots, each with the company-wide assignments its snapshot holds."""
    with conn.cursor() as cur:
        copy_users(cur, company_id, [snapshot.user_id for snapshot in snapshots])
        held = {
            snapshot.user_id: [BulkAssignment(a.role_id, id=a.assignment_id) for a in snapshot.assignments]
            for snapshot in snapshots
        }
        copy_assignments(cur, company_id, held)


def produce(producer: Producer, snapshots: list[UserAccessSnapshot], roles: Roles) -> None:
    now = datetime.now(UTC)
    for snapshot in snapshots:
        message = events.user_access_changed(
            snapshot,
            reason=AccessChangeReason.ROLE_ASSIGNED,
            version=1,
            changed_role_id=roles.main,
            correlation_id=uuid.uuid4(),
            occurred_at=now,
        )
        headers = [
            ("event-type", message.event_type.encode()),
            ("contract-version", b"1"),
            ("correlation-id", str(message.correlation_id).encode()),
        ]
        value = message.value.encode()
        while True:
            try:
                producer.produce(message.topic, value=value, key=message.key, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)


def fill(url: str, bootstrap: str, users: int) -> list[uuid.UUID]:
    """Users in the database and their events on the topic; returns the user ids in the order produced."""
    producer = Producer(producer_config({"bootstrap.servers": bootstrap}))
    order: list[uuid.UUID] = []
    with psycopg.connect(url) as conn:
        roles = seed_roles(conn)
        for start in range(0, users, CHUNK):
            snapshots = [snapshot_of(uuid.uuid4(), roles, i) for i in range(start, min(start + CHUNK, users))]
            write_users(conn, snapshots, roles.company_id)
            conn.commit()
            produce(producer, snapshots, roles)
            order.extend(s.user_id for s in snapshots)
            print(f"  filled {len(order):,} of {users:,}", end="\r", flush=True)
    assert producer.flush(300) == 0, "events left undelivered"
    print()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    return order


def depths(order: list[uuid.UUID], partitions: int) -> dict[str, uuid.UUID]:
    """The newest record of its partition, one half-way down its partition, and its partition's oldest."""
    last = order[-1]
    home = key_partition(str(last).encode(), partitions)
    same = [user for user in order if key_partition(str(user).encode(), partitions) == home]
    return {"newest": last, "middle": same[len(same) // 2], "oldest": same[0]}


def in_process(settings: Settings, user: uuid.UUID) -> tuple[float, dict[str, Any]]:
    container = Container(settings)
    try:
        # The pool is open before the clock starts, as in a running `serve`.
        container.connections.database.ping()
        started = time.perf_counter()
        shown = container.use_cases.access_show(user)
        elapsed = time.perf_counter() - started
    finally:
        container.close()
    assert shown.verdict.value == "matching", shown.verdict
    return elapsed, {"records_read": shown.records_read, "partition": shown.partition}


def as_process(env: dict[str, str], user: uuid.UUID) -> float:
    started = time.perf_counter()
    result = subprocess.run([*CLI, str(user), "--json"], env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "matching"
    return elapsed


def measure(url: str, bootstrap: str, users: dict[str, uuid.UUID], runs: int) -> None:
    settings = Settings(database_url=url, kafka_bootstrap_servers=bootstrap, worker_http_port=0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIN_IDENTITY_")}
    env.update(
        {
            "PIN_IDENTITY_DATABASE_URL": url,
            "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "PIN_IDENTITY_LOG_FORMAT": "json",
        }
    )
    for depth, user in users.items():
        timings = [in_process(settings, user) for _ in range(runs)]
        processes = [as_process(env, user) for _ in range(runs)]
        seconds = [t for t, _ in timings]
        facts = timings[0][1]
        print(
            f"{depth:>6}: partition {facts['partition']}, {facts['records_read']:,} records read; "
            f"in process median {statistics.median(seconds) * 1000:,.0f} ms "
            f"({', '.join(f'{s * 1000:,.0f}' for s in seconds)}); "
            f"as a process median {statistics.median(processes):.2f} s "
            f"({', '.join(f'{s:.2f}' for s in processes)})",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    print(f"command: {' '.join(sys.argv)}")
    with (
        scratch_dir("bench-access-show-") as workdir,
        embedded_postgres(workdir) as admin_url,
        bench_broker(workdir) as broker,
    ):
        bootstrap, which = broker.bootstrap, broker.name
        print(f"broker: {which}; {args.partitions} partitions; {args.users:,} users")
        url = fresh_database(admin_url, "bench_access_show")
        create_topic(bootstrap, args.partitions)
        started = time.perf_counter()
        order = fill(url, bootstrap, args.users)
        print(f"filled in {time.perf_counter() - started:,.0f} s")
        measure(url, bootstrap, depths(order, args.partitions), args.runs)
    print(f"machine: {machine_line()}")
    print(f"runs per figure: {args.runs}")


if __name__ == "__main__":
    main()

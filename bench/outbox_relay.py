"""Outbox relay throughput against a raw producer sending the same messages, in one run.

    .venv/bin/python bench/outbox_relay.py [--events 50000] [--runs 5]

Starts its own embedded PostgreSQL (durable defaults) and embedded broker in a temporary directory.
Target (issue 13): relay events/s >= 70% of the raw producer's, in the same run.

Both figures include the producer's start, and both producers start the same way. The relay starts its
producer, then reads its first batch; the raw producer starts, polls for 10 ms, then sends. A new
idempotent producer cannot send before it has a producer id, and asks for one once a broker connection is
up. Until 2026-11-30 the producers connected lazily (`enable.sparse.connections`), and the request waited on
librdkafka's 500 ms retry timer: half a second of each ~0.6 s raw run, or a full second when the first message
came a few ms after the start, was the same wait for both, and the ratio said little about the relay. Now the
producer id arrives within a few ms. (A producer that sends its first message the very moment it starts still
waits the 500 ms: hence the raw producer's 10 ms.)

Each timing starts after a garbage collection: this process holds a million objects of sample events, and
a full collection of them (about 0.1 s) landing in one timing or the other said nothing about either.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime

import psycopg
from confluent_kafka import Producer
from psycopg import sql

from bench_database import scratch_dir
from pin_identity.adapters.kafka.embedded import free_port, start_broker, stop_broker
from pin_identity.adapters.kafka.publisher import producer_config
from pin_identity.adapters.postgres import migrate
from pin_identity.adapters.postgres.embedded import ensure_embedded_postgres, stop_embedded_postgres
from pin_identity.adapters.postgres.outbox_writer import write_outbox
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain import events
from pin_identity.domain.model import AccessChangeReason, ActiveAssignment, Scope, UserAccessSnapshot

RAW_PRODUCER_HEAD_START_S = 0.01


def sample_messages(count: int) -> list[events.OutboxMessage]:
    """UserAccessChanged events of realistic size (two assignments each)."""
    role_id, company_id = uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC)
    messages = []
    for _ in range(count):
        snapshot = UserAccessSnapshot(
            uuid.uuid4(),
            company_id,
            (
                ActiveAssignment(
                    uuid.uuid4(), role_id, "sales-manager", Scope.organization(company_id), None
                ),
                ActiveAssignment(
                    uuid.uuid4(), uuid.uuid4(), "developer-manager", Scope.organization(company_id), None
                ),
            ),
        )
        messages.append(
            events.user_access_changed(
                snapshot,
                reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
                version=2,
                changed_role_id=role_id,
                correlation_id=uuid.uuid4(),
                occurred_at=now,
            )
        )
    return messages


def raw_producer_rate(bootstrap: str, messages: list[events.OutboxMessage]) -> float:
    gc.collect()  # before the producer starts (see the module's docstring)
    producer = Producer(producer_config({"bootstrap.servers": bootstrap}))
    acked = 0

    def on_delivery(error: object, _message: object) -> None:
        nonlocal acked
        acked += error is None

    started = time.perf_counter()
    # As the relay does (it starts its producer, then reads its first batch): a producer that sends its first
    # message the moment it starts waits 0.5 s for its producer id (see the module's docstring).
    producer.poll(RAW_PRODUCER_HEAD_START_S)
    for message in messages:
        headers = [
            ("event-type", message.event_type.encode()),
            ("contract-version", b"1"),
            ("correlation-id", str(message.correlation_id).encode()),
        ]
        while True:
            try:
                producer.produce(
                    message.topic,
                    key=message.key,
                    value=message.value.encode(),
                    headers=headers,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    assert acked == len(messages), f"raw producer: {acked} of {len(messages)} acknowledged"
    return len(messages) / elapsed


def relay_rate(admin_url: str, bootstrap: str, messages: list[events.OutboxMessage], run: int) -> float:
    name = f"bench_relay_{run}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        write_outbox(conn, messages)
    container = Container(Settings(database_url=url, kafka_bootstrap_servers=bootstrap, worker_http_port=0))
    try:
        relay = container.outbox_relay()
        gc.collect()
        started = time.perf_counter()
        relay.run(threading.Event(), once=True)
        elapsed = time.perf_counter() - started
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT count(*) FROM identity.outbox_events").fetchone()
        assert left == (0,), f"relay left {left} rows"
    finally:
        container.close()
    return len(messages) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    with scratch_dir("bench-relay-") as workdir:
        admin_url = ensure_embedded_postgres(workdir, database="postgres")
        broker = start_broker(free_port(), workdir / "broker.log")
        try:
            raw, relay = [], []
            for run in range(args.runs):
                raw.append(raw_producer_rate(broker.bootstrap_servers, sample_messages(args.events)))
                messages = sample_messages(args.events)
                relay.append(relay_rate(admin_url, broker.bootstrap_servers, messages, run))
                print(f"run {run + 1}: raw {raw[-1]:,.0f} ev/s, relay {relay[-1]:,.0f} ev/s", flush=True)
        finally:
            stop_broker(broker.pid)
            stop_embedded_postgres(workdir)
        raw_median, relay_median = statistics.median(raw), statistics.median(relay)
        cpu = platform.processor() or "cpu"
        print(f"machine: {platform.machine()}, {cpu}, python {platform.python_version()}")
        print(f"events per run: {args.events:,}, runs: {args.runs}")
        print(f"raw producer median: {raw_median:,.0f} events/s")
        print(f"outbox relay median: {relay_median:,.0f} events/s")
        print(f"relay / raw: {relay_median / raw_median:.0%} (target >= 70%)")


if __name__ == "__main__":
    main()

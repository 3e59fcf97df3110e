"""Outbox relay throughput against a raw producer and a bare read-and-produce loop sending the same messages.

    .venv/bin/python bench/outbox_relay.py [--events 50000] [--runs 5]

Starts its own embedded PostgreSQL (durable defaults) and brokers (bench_brokers.py: Apache Kafka, or
`BENCH_BROKER=tansu`) in a temporary directory. Target: the relay >= 80% of the bare loop's events/s.

Each run times three things, each against a broker started for it alone:
- the raw producer: the messages, already in memory, produced with their headers;
- the bare loop: the same messages read from a fresh outbox in pages and produced, with nothing else a relay
  must do (removing what was acknowledged, the lock, the order per key). Like the relay, it reads a page,
  then produces it: what reading from PostgreSQL costs on its own;
- the relay itself (`OutboxRelay.run(once=True)`) over a fresh outbox.

All three include the producer's start. The relay starts its producer, then reads its first batch; the
raw producer and the bare loop poll their new producer for 10 ms before they send or read. A new idempotent
producer cannot send before it has a producer id, and asks for one once a broker connection is up. Until
2026-11-30 the producers connected lazily (`enable.sparse.connections`), and the request waited on
librdkafka's 500 ms retry timer: half a second of each ~0.6 s raw run was the same wait for both, and the
ratio said little about the relay. Now the producer id arrives within a few ms. (A producer that sends its
first message the very moment it starts still waits the 500 ms: hence the 10 ms.)

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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from confluent_kafka import Message, Producer
from psycopg import sql

from bench_brokers import bench_broker, broker_name
from bench_database import scratch_dir
from pin_identity.adapters.kafka.publisher import KafkaEventPublisher, producer_config
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.adapters.postgres import migrate
from pin_identity.adapters.postgres.embedded import ensure_embedded_postgres, stop_embedded_postgres
from pin_identity.adapters.postgres.outbox_queue import PostgresOutboxQueue
from pin_identity.adapters.postgres.outbox_writer import write_outbox
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain import events
from pin_identity.domain.events import PUBLISHED_TOPICS
from pin_identity.domain.model import AccessChangeReason, ActiveAssignment, Scope, UserAccessSnapshot
from pin_identity.jobs.outbox_relay import OutboxRelay, RelaySettings

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


def bare_loop_rate(url: str, bootstrap: str, count: int) -> float:
    """The relay's floor: a loop that reads the outbox in pages of 2,000 rows and produces each row with its
    headers, knowing which row each acknowledgement is for (by key, as the relay's producer does). It does
    less than any relay must: it removes nothing, holds no lock and keeps no order per key."""
    gc.collect()
    with psycopg.connect(url, autocommit=True) as conn:
        producer = Producer(producer_config({"bootstrap.servers": bootstrap}))
        in_flight: dict[bytes, int] = {}
        acknowledged: list[int] = []

        def on_delivery(error: object, message: Message) -> None:
            outbox_id = in_flight.pop(message.key())  # type: ignore[arg-type]
            if error is None:
                acknowledged.append(outbox_id)

        started = time.perf_counter()
        producer.poll(RAW_PRODUCER_HEAD_START_S)
        after = 0
        while rows := conn.cursor(binary=True).execute(BARE_LOOP_PAGE, {"after": after}).fetchall():
            for outbox_id, topic, key_text, value, event_type, correlation_id in rows:
                key = key_text.encode()
                headers = [
                    ("event-type", event_type),
                    ("contract-version", "1"),
                    ("correlation-id", correlation_id),
                ]
                while True:
                    try:
                        producer.produce(topic, value, key, headers=headers, on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.1)
                in_flight[key] = outbox_id
            producer.poll(0)
            after = rows[-1][0]
        producer.flush(120)
        elapsed = time.perf_counter() - started
    assert len(acknowledged) == count, f"bare loop: {len(acknowledged)} of {count} acknowledged"
    return count / elapsed


BARE_LOOP_PAGE = """SELECT id, topic, message_key, convert_to(value, 'UTF8'), event_type, correlation_id::text
FROM identity.outbox_events WHERE id > %(after)s ORDER BY id LIMIT 2000"""


def _plain_relay(container: Container) -> OutboxRelay:
    """The relay as it was before transactions: an idempotent producer without a transactional.id."""
    publisher = KafkaEventPublisher(container.kafka_client_config, ensure_topics=container.ensure_topics)
    return OutboxRelay(
        PostgresOutboxQueue(container.database), publisher, RelaySettings(), clock=SYSTEM_CLOCK
    )


def relay_rate(url: str, bootstrap: str, count: int, *, transactional: bool = True) -> float:
    settings = Settings(
        database_url=url, kafka_bootstrap_servers=bootstrap, worker_http_port=0, kafka_replication_factor=1
    )
    container = Container(settings)
    try:
        relay = container.outbox_relay() if transactional else _plain_relay(container)
        gc.collect()
        started = time.perf_counter()
        relay.run(threading.Event(), once=True)
        elapsed = time.perf_counter() - started
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT count(*) FROM identity.outbox_events").fetchone()
        assert left == (0,), f"relay left {left} rows"
    finally:
        container.close()
    return count / elapsed


@contextmanager
def outbox_database(admin_url: str, name: str, messages: list[events.OutboxMessage]) -> Iterator[str]:
    """A fresh database with the messages in its outbox, dropped afterwards.

    The server's own work after the bulk write (the table's analysis, and later the vacuum of the rows a
    timing removed) would otherwise run during a later timing: in one process, the raw producer fell from
    about 230,000 to 105,000-129,000 ev/s over five runs, with a fresh broker for each timing."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        write_outbox(conn, messages)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) identity.outbox_events")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    try:
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def fresh_broker(workdir: Path) -> Iterator[str]:
    """A broker started for one timing, with the topics the relay writes to (12 partitions): no timing
    shares a broker's log, page cache or cleaner with another."""
    with bench_broker(workdir) as broker:
        ensure_topics(
            {"bootstrap.servers": broker.bootstrap},
            PUBLISHED_TOPICS,
            TopicLayout(12, broker.replication_factor),
        )
        _start_transaction_coordinator(broker.bootstrap)
        yield broker.bootstrap


def _start_transaction_coordinator(bootstrap: str) -> None:
    """A broker in service has its transaction log long before a relay starts; a new one creates and loads
    it on the first init_transactions() (about a second here, in every relay timing otherwise: half of a
    50,000-event run). A throwaway transactional producer makes it before the timing."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4()}"})
    producer.init_transactions(30)
    producer.flush(0)


def one_run(
    admin_url: str, workdir: Path, events_per_run: int, run: int, *, without_transactions: bool
) -> tuple[float, float, float, float]:
    """Raw producer, bare loop, relay and (with `without_transactions`) the relay on a plain idempotent
    producer, each on a broker of its own (and all but the first on a fresh outbox)."""
    with fresh_broker(workdir) as bootstrap:
        raw = raw_producer_rate(bootstrap, sample_messages(events_per_run))
    with (
        outbox_database(admin_url, f"bench_bare_{run}", sample_messages(events_per_run)) as url,
        fresh_broker(workdir) as bootstrap,
    ):
        bare = bare_loop_rate(url, bootstrap, events_per_run)
    with (
        outbox_database(admin_url, f"bench_relay_{run}", sample_messages(events_per_run)) as url,
        fresh_broker(workdir) as bootstrap,
    ):
        relay = relay_rate(url, bootstrap, events_per_run)
    if not without_transactions:
        return raw, bare, relay, float("nan")
    with (
        outbox_database(admin_url, f"bench_plain_{run}", sample_messages(events_per_run)) as url,
        fresh_broker(workdir) as bootstrap,
    ):
        plain = relay_rate(url, bootstrap, events_per_run, transactional=False)
    return raw, bare, relay, plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--without-transactions",
        action="store_true",
        help="also time the relay on a plain idempotent producer (what transactions cost)",
    )
    args = parser.parse_args()

    with scratch_dir("bench-relay-") as workdir:
        admin_url = ensure_embedded_postgres(workdir, database="postgres")
        try:
            raw: list[float] = []
            bare: list[float] = []
            relay: list[float] = []
            plain: list[float] = []
            for run in range(args.runs):
                rates = one_run(
                    admin_url, workdir, args.events, run, without_transactions=args.without_transactions
                )
                for figures, rate in zip((raw, bare, relay, plain), rates, strict=True):
                    figures.append(rate)
                print(
                    f"run {run + 1}: raw {rates[0]:,.0f} ev/s, bare loop {rates[1]:,.0f} ev/s, "
                    f"relay {rates[2]:,.0f} ev/s, relay without transactions {rates[3]:,.0f} ev/s",
                    flush=True,
                )
        finally:
            stop_embedded_postgres(workdir)
        raw_median, bare_median, relay_median = map(statistics.median, (raw, bare, relay))
        cpu = platform.processor() or "cpu"
        print(f"machine: {platform.machine()}, {cpu}, python {platform.python_version()}")
        print(f"broker: {broker_name()}")
        print(f"events per run: {args.events:,}, runs: {args.runs}")
        print(f"raw producer median: {raw_median:,.0f} events/s")
        print(f"bare loop median: {bare_median:,.0f} events/s ({bare_median / raw_median:.0%} of raw)")
        print(f"outbox relay median: {relay_median:,.0f} events/s ({relay_median / bare_median:.0%} of bare)")
        print(f"relay / raw: {relay_median / raw_median:.0%}")
        print(f"relay / bare loop: {relay_median / bare_median:.0%} (target >= 80%)")
        if args.without_transactions:
            plain_median = statistics.median(plain)
            print(f"relay without transactions median: {plain_median:,.0f} events/s")
            print(f"transactions cost the relay {1 - relay_median / plain_median:.0%} (target <= 10%)")


if __name__ == "__main__":
    main()

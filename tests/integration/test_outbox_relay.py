"""The outbox relay against real PostgreSQL and a real broker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer

from pin_identity.adapters.kafka.embedded import free_port, start_broker, stop_broker
from pin_identity.adapters.postgres.outbox_queue import PostgresOutboxQueue
from pin_identity.adapters.postgres.outbox_writer import write_outbox
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.events import ACCESS_TOPIC, OutboxMessage, envelope
from pin_identity.jobs.ports import RelayRole
from tests.support.kafka_tap import EventTap


def _message(key: uuid.UUID, n: int, size: int = 0) -> OutboxMessage:
    return envelope(
        event_type="UserAccessChanged",
        topic=ACCESS_TOPIC,
        aggregate_type="User",
        aggregate_id=key,
        payload={"n": n, "pad": "x" * size},
        correlation_id=uuid.uuid4(),
        occurred_at=datetime.now(UTC),
    )


def _write(database_url: str, messages: list[OutboxMessage]) -> None:
    with psycopg.connect(database_url) as conn:
        write_outbox(conn, messages)


def _outbox_count(database_url: str, table: str = "outbox_events") -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f"SELECT count(*) FROM identity.{table}").fetchone()
    return int(row[0]) if row else 0


def _run_relay(container: Container) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=container.outbox_relay().run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def test_relay_publishes_in_order_per_key_and_deletes_what_was_acknowledged(
    container: Container, tap: EventTap, database_url: str
) -> None:
    keys = [uuid.uuid4() for _ in range(5)]
    for batch in range(4):
        _write(database_url, [_message(key, batch * 10 + i) for key in keys for i in range(10)])
    container.outbox_relay().run(threading.Event(), once=True)

    events = tap.wait_for(lambda e: uuid.UUID(e.key) in keys, 200)
    for key in keys:
        sequence = [e.payload["n"] for e in events if e.key == str(key)]
        assert sequence == list(range(40))
    assert _outbox_count(database_url) == 0


def test_a_row_the_broker_rejects_goes_to_dead_letters_and_blocks_nothing(
    container: Container, tap: EventTap, database_url: str
) -> None:
    key = uuid.uuid4()
    _write(database_url, [_message(key, 1), _message(key, 2, size=2_000_000), _message(key, 3)])
    container.outbox_relay().run(threading.Event(), once=True)

    events = tap.wait_for(lambda e: e.key == str(key), 2)
    assert [e.payload["n"] for e in events] == [1, 3]
    assert _outbox_count(database_url) == 0
    with psycopg.connect(database_url) as conn:
        [(error,)] = conn.execute("SELECT error FROM identity.outbox_dead_letters").fetchall()
    assert "MSG_SIZE_TOO_LARGE" in error


def test_a_row_that_commits_late_is_not_overtaken(
    container: Container, tap: EventTap, database_url: str
) -> None:
    key = uuid.uuid4()
    with psycopg.connect(database_url) as late:
        write_outbox(late, [_message(key, 1)])  # older transaction, lower id, not yet committed
        _write(database_url, [_message(key, 2)])  # younger transaction, committed first
        # With --once the relay works until the outbox holds nothing committed: it waits for the old one.
        relay = threading.Thread(
            target=container.outbox_relay().run, args=(threading.Event(),), kwargs={"once": True}
        )
        relay.start()
        assert tap.settle(lambda e: e.key == str(key), quiet_s=0.5) == []
        assert _outbox_count(database_url) == 1
        late.commit()
    relay.join(30)
    assert not relay.is_alive()
    assert [e.payload["n"] for e in tap.wait_for(lambda e: e.key == str(key), 2)] == [1, 2]


def test_only_one_relay_is_active_and_a_standby_takes_over(container: Container, settings: Settings) -> None:
    first, second = PostgresOutboxQueue(container.database), PostgresOutboxQueue(Container(settings).database)
    assert first.try_become_active() is RelayRole.ACTIVE
    assert second.try_become_active() is RelayRole.STANDBY
    first.reset()  # the active relay's session dies: its lock goes with it, unclean
    assert second.try_become_active() is RelayRole.TAKEN_OVER
    second.stand_down()  # a relay that stood down says so: the next one need not wait
    assert first.try_become_active() is RelayRole.ACTIVE


@pytest.fixture
def restartable_broker(tmp_path: Path) -> Iterator[dict[str, int]]:
    port = free_port()
    state = {"port": port, "pid": start_broker(port, tmp_path / "broker.log").pid}
    yield state
    stop_broker(state["pid"])


class LiveCounter:
    """A consumer group member counting distinct event ids as they arrive, across broker restarts."""

    def __init__(self, bootstrap: str):
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"live-{uuid.uuid4()}",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "enable.auto.commit": True,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self._consumer.subscribe([ACCESS_TOPIC])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.consume(1000, 0.2):
                if not message.error():
                    self.seen.add(message.value().decode().split('"eventId":"')[1][:36])

    def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.seen) < count and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


@pytest.mark.slow
def test_no_event_is_lost_while_the_broker_is_stopped_and_restarted(
    settings: Settings, database_url: str, restartable_broker: dict[str, int]
) -> None:
    bootstrap = f"127.0.0.1:{restartable_broker['port']}"
    # A short delivery timeout keeps the outage short; production keeps the default minute.
    overrides = {"kafka_bootstrap_servers": bootstrap, "kafka_config": '{"message.timeout.ms": "5000"}'}
    container = Container(settings.model_copy(update=overrides))
    container.ensure_topics()
    live = LiveCounter(bootstrap)
    written: list[str] = []

    def write_wave(size: int) -> None:
        messages = [_message(uuid.uuid4(), n) for n in range(size)]
        for start in range(0, size, 100):  # many small transactions, like real traffic
            _write(database_url, messages[start : start + 100])
        written.extend(str(m.event_id) for m in messages)

    stop, relay = _run_relay(container)
    try:
        write_wave(2000)
        live.wait_for(2000, 30)
        assert len(live.seen) == 2000, "the live consumer must see the first wave before the outage"
        stop_broker(restartable_broker["pid"])
        write_wave(2000)  # written while the broker is down: the relay keeps failing, nothing is lost
        time.sleep(2)
        assert _outbox_count(database_url) >= 1
        restartable_broker["pid"] = start_broker(
            restartable_broker["port"], Path(settings.data_dir) / "b2.log"
        ).pid
        write_wave(1000)
        live.wait_for(5000, 90)
    finally:
        stop.set()
        relay.join(30)
        live.close()
        container.close()
    assert set(written) <= live.seen, f"lost {len(set(written) - live.seen)} events"
    assert _outbox_count(database_url) == 0

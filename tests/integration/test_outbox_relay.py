"""The outbox relay against real PostgreSQL and a real broker."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer

from pin_identity.adapters.kafka.reader import TopicReader
from pin_identity.adapters.postgres.outbox_queue import PostgresOutboxQueue
from pin_identity.adapters.postgres.outbox_writer import write_outbox
from pin_identity.composition import Container
from pin_identity.composition.connections import Connections
from pin_identity.config import Settings
from pin_identity.domain.events import ACCESS_TOPIC, OutboxMessage
from pin_identity.operations.ports.outbox import PendingEvent, RelayRole
from tests.support.brokers import ProxiedBroker, RestartableBroker
from tests.support.databases import scratch_database
from tests.support.kafka_tap import EventTap
from tests.support.relay import RelaySignals, access_message, outbox_count, read_rows
from tests.support.waiting import first_answer, holds_within, wait_until

# An event no broker of ours takes: over the 8 MiB every pin.identity topic allows (and the producer with it).
TOO_LARGE = 9 * 2**20


def _message(key: uuid.UUID, n: int, size: int = 0) -> OutboxMessage:
    return access_message(key, {"n": n, "pad": "x" * size})


def _write(database_url: str, messages: list[OutboxMessage]) -> None:
    with psycopg.connect(database_url) as conn:
        write_outbox(conn, messages)


def _run_relay(
    container: Container, signals: RelaySignals | None = None
) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    relay = container.jobs.outbox_relay(observer=signals)
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def test_relay_publishes_in_order_per_key_and_deletes_what_was_acknowledged(
    container: Container, tap: EventTap, database_url: str
) -> None:
    keys = [uuid.uuid4() for _ in range(5)]
    for batch in range(4):
        _write(database_url, [_message(key, batch * 10 + i) for key in keys for i in range(10)])
    container.jobs.outbox_relay().run(threading.Event(), once=True)

    events = tap.wait_for(lambda e: uuid.UUID(e.key) in keys, 200)
    for key in keys:
        sequence = [e.payload["n"] for e in events if e.key == str(key)]
        assert sequence == list(range(40))
    assert outbox_count(database_url) == 0


def test_a_row_the_broker_rejects_goes_to_dead_letters_and_blocks_nothing(
    container: Container, tap: EventTap, database_url: str
) -> None:
    key = uuid.uuid4()
    _write(database_url, [_message(key, 1), _message(key, 2, size=TOO_LARGE), _message(key, 3)])
    container.jobs.outbox_relay().run(threading.Event(), once=True)

    events = tap.wait_for(lambda e: e.key == str(key), 2)
    assert [e.payload["n"] for e in events] == [1, 3]
    assert outbox_count(database_url) == 0
    with psycopg.connect(database_url) as conn:
        [(error,)] = conn.execute("SELECT error FROM identity.outbox_dead_letters").fetchall()
    assert "MSG_SIZE_TOO_LARGE" in error


def test_a_rejected_row_whose_id_the_outbox_hands_out_again_still_reaches_the_dead_letters(
    container: Container, tap: EventTap, database_url: str
) -> None:
    """The docs' `TRUNCATE identity.outbox_events RESTART IDENTITY` hands ids out again: a row rejected under
    an id a dead letter already carries is a dead letter of its own, and the row behind it is published."""
    first, second = uuid.uuid4(), uuid.uuid4()
    _write(database_url, [_message(first, 1, size=TOO_LARGE), _message(first, 2)])
    container.jobs.outbox_relay().run(threading.Event(), once=True)
    with psycopg.connect(database_url) as conn:
        conn.execute("TRUNCATE identity.outbox_events RESTART IDENTITY")
    _write(database_url, [_message(second, 1, size=TOO_LARGE), _message(second, 2)])

    drained = threading.Thread(
        target=container.jobs.outbox_relay().run,
        args=(threading.Event(),),
        kwargs={"once": True},
        daemon=True,
    )
    drained.start()
    drained.join(60)

    assert not drained.is_alive(), "the relay never drained the outbox"
    assert [e.payload["n"] for e in tap.wait_for(lambda e: e.key in (str(first), str(second)), 2)] == [2, 2]
    with psycopg.connect(database_url) as conn:
        dead = conn.execute(
            "SELECT id, message_key FROM identity.outbox_dead_letters ORDER BY failed_at"
        ).fetchall()
    assert dead == [(1, str(first)), (1, str(second))]


def test_a_row_that_commits_late_is_not_overtaken(
    container: Container, tap: EventTap, database_url: str
) -> None:
    key = uuid.uuid4()
    with psycopg.connect(database_url) as late:
        write_outbox(late, [_message(key, 1)])  # older transaction, lower id, not yet committed
        _write(database_url, [_message(key, 2)])  # younger transaction, committed first
        # With --once the relay works until the outbox holds nothing committed: it waits for the old one.
        relay = threading.Thread(
            target=container.jobs.outbox_relay().run, args=(threading.Event(),), kwargs={"once": True}
        )
        relay.start()
        assert tap.settle(lambda e: e.key == str(key), quiet_s=0.5) == []
        assert outbox_count(database_url) == 1
        late.commit()
    relay.join(30)
    assert not relay.is_alive()
    assert [e.payload["n"] for e in tap.wait_for(lambda e: e.key == str(key), 2)] == [1, 2]


def test_a_relay_starting_on_an_emptied_outbox_reads_the_next_row(
    connections: Connections, database_url: str
) -> None:
    """Every row ever written published and removed, the id sequence far along (any restart after the first
    day): the first reads find nothing up to the horizon, and a new row must still be read, not wait until
    reads have walked up to where the horizon stood."""
    _write(database_url, [_message(uuid.uuid4(), n) for n in range(5000)])
    with psycopg.connect(database_url) as conn:
        conn.execute("DELETE FROM identity.outbox_events")
    queue = PostgresOutboxQueue(connections.database)
    try:
        assert queue.try_become_active() is not RelayRole.STANDBY
        assert read_rows(queue, 2000, 0) == [] and read_rows(queue, 2000, 0) == []
        key = uuid.uuid4()
        _write(database_url, [_message(key, 1)])
        read: list[PendingEvent] = []
        wait_until(lambda: bool(read.extend(read_rows(queue, 2000, 0)) or read), "the new row is read")
        assert [row.key for row in read] == [str(key)]
    finally:
        queue.reset()


def test_a_row_that_commits_late_is_not_stepped_over_by_the_rows_after_it(
    container: Container, tap: EventTap, database_url: str
) -> None:
    """The relay reads on from the last row it read, so it must never read past a row that may still
    commit: here one of another key, whose id comes first."""
    late_key, early_key = uuid.uuid4(), uuid.uuid4()
    ours = {str(late_key), str(early_key)}
    stop, relay = _run_relay(container)
    try:
        with psycopg.connect(database_url) as late:
            write_outbox(late, [_message(late_key, 1)])  # the lower id, its transaction still open
            _write(database_url, [_message(early_key, 2)])  # the higher id, committed
            assert tap.settle(lambda e: e.key in ours, quiet_s=0.5) == []
            late.commit()
        wait_until(lambda: outbox_count(database_url) == 0, "both rows were published", timeout_s=30)
    finally:
        stop.set()
        relay.join(30)
    # Both published once the late one committed (a relay that had stepped over it would never drain the
    # outbox); their order on the topic is not compared: two keys land on partitions read in any order.
    assert sorted(e.key for e in tap.wait_for(lambda e: e.key in ours, 2)) == sorted(ours)


def test_the_backlog_is_counted_while_short_and_estimated_from_the_ids_when_long(
    connections: Connections, database_url: str
) -> None:
    queue = PostgresOutboxQueue(connections.database)
    _write(database_url, [_message(uuid.uuid4(), n) for n in range(3)])
    assert queue.backlog().waiting == 3
    _write(database_url, [_message(uuid.uuid4(), n) for n in range(12_000)])
    with psycopg.connect(database_url) as conn:  # rows acknowledged out of order leave holes
        conn.execute("DELETE FROM identity.outbox_events WHERE id % 100 = 0")
    backlog = queue.backlog()
    waiting, oldest_age_s = backlog.waiting, backlog.oldest_age_s
    queue.reset()
    assert outbox_count(database_url) == 12_003 - 120
    assert 12_003 - 120 <= waiting <= 12_003  # the id range, holes included
    assert 0 <= oldest_age_s < 60


def test_a_removal_lost_with_its_session_is_sent_again_before_the_next_session_reads(
    connections: Connections, database_url: str
) -> None:
    """A removal goes out after a read without being waited for. Should the session die before a sync
    commits it, the row must not be read again: it would be published behind its key's later row, whose
    removal the next session commits."""
    key = uuid.uuid4()
    _write(database_url, [_message(key, n) for n in range(1, 4)])
    queue = PostgresOutboxQueue(connections.database)
    assert queue.try_become_active() is RelayRole.ACTIVE
    [first] = read_rows(queue, 1, 0)
    queue.settle([first.outbox_id], {})
    [second] = read_rows(queue, 1, first.outbox_id)  # the first row's removal goes out after this read
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'pin-identity-outbox-relay'"
        )
    queue.settle([second.outbox_id], {})
    with pytest.raises(psycopg.OperationalError):
        read_rows(queue, 10, second.outbox_id)
    queue.stand_down()  # what the relay does after a failure
    assert outbox_count(database_url) == 3  # neither removal was committed

    assert queue.try_become_active() is RelayRole.TAKEN_OVER
    [third] = read_rows(queue, 10, 0)  # neither of the two rows already delivered
    assert third.outbox_id > second.outbox_id
    assert queue.is_drained() is False and outbox_count(database_url) == 1
    queue.reset()


def _crash_hands_out_again(database_url: str, outbox_id: int) -> None:
    """What a crash that loses the WAL tail can leave: the row `outbox_id` lost, and the id sequence back
    below it (its advance was in the lost tail too), so the next row written takes the same id."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("DELETE FROM identity.outbox_events WHERE id >= %s", (outbox_id,))
        admin.execute("SELECT setval('identity.outbox_events_id_seq', %s, false)", (outbox_id,))


def _end_relay_session(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'pin-identity-outbox-relay'"
        )


def test_a_removal_that_outlives_a_crash_spares_a_new_row_that_reuses_its_id(
    connections: Connections, database_url: str
) -> None:
    """The relay's session commits without waiting for the WAL flush, and so do fan-out pages: a crash that
    loses the WAL tail can take back the id sequence's advance, and hand out again the id of a row the relay
    already acknowledged and still holds for removal. The next session sends that removal before its first
    read: it must not delete the new row that carries the id, which was never published."""
    _write(database_url, [_message(uuid.uuid4(), 1)])
    queue = PostgresOutboxQueue(connections.database)
    assert queue.try_become_active() is RelayRole.ACTIVE
    [published] = read_rows(queue, 10, 0)
    queue.settle([published.outbox_id], {})  # acknowledged: its removal goes out with the next read
    _end_relay_session(database_url)  # the server goes down with the session
    queue.stand_down()  # what the relay does after a failure: the removal is kept for the next session
    _crash_hands_out_again(database_url, published.outbox_id)
    key = uuid.uuid4()
    _write(database_url, [_message(key, 2)])
    assert queue.try_become_active() is not RelayRole.STANDBY
    read = read_rows(queue, 10, 0)
    queue.reset()
    assert [(row.outbox_id, row.key) for row in read] == [(published.outbox_id, str(key))]
    assert outbox_count(database_url) == 1


def test_only_one_relay_is_active_and_a_standby_takes_over(
    connections: Connections, settings: Settings
) -> None:
    first, second = (
        PostgresOutboxQueue(connections.database),
        PostgresOutboxQueue(Connections(settings).database),
    )
    assert first.try_become_active() is RelayRole.ACTIVE
    assert second.try_become_active() is RelayRole.STANDBY
    first.reset()  # the active relay's session dies: its lock goes with it, unclean

    # The server ends a closed session's backend (and frees its lock) a moment after the client let go:
    # the standby looks again until the lock is free, as a standby does.
    def past_standing_by() -> RelayRole | None:
        role = second.try_become_active()
        return None if role is RelayRole.STANDBY else role

    role = first_answer(past_standing_by, "the standby finds the lock free", timeout_s=5, every_s=0.01)
    assert role is RelayRole.TAKEN_OVER
    second.stand_down()  # a relay that stood down says so: the next one need not wait
    assert first.try_become_active() is RelayRole.ACTIVE


@pytest.fixture
def restartable_broker(tmp_path: Path) -> Iterator[RestartableBroker]:
    broker = RestartableBroker.started(tmp_path / "broker")
    yield broker
    broker.stop()


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
        """Until `count` events arrived, or `timeout_s` passed: the test judges what arrived."""
        holds_within(lambda: len(self.seen) >= count, timeout_s, every_s=0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


@pytest.mark.slow
def test_no_event_is_lost_while_the_broker_is_stopped_and_restarted(
    settings: Settings, database_url: str, restartable_broker: RestartableBroker
) -> None:
    bootstrap = f"127.0.0.1:{restartable_broker.port}"
    # A short delivery timeout keeps the outage short; production keeps the default minute.
    overrides = {"kafka_bootstrap_servers": bootstrap, "kafka_config": '{"message.timeout.ms": "5000"}'}
    container = Container(settings.model_copy(update=overrides))
    container.connections.ensure_topics()
    live = LiveCounter(bootstrap)
    written: list[str] = []

    def write_wave(size: int) -> None:
        messages = [_message(uuid.uuid4(), n) for n in range(size)]
        for start in range(0, size, 100):  # many small transactions, like real traffic
            _write(database_url, messages[start : start + 100])
        written.extend(str(m.event_id) for m in messages)

    signals = RelaySignals()
    stop, relay = _run_relay(container, signals)
    try:
        write_wave(2000)
        live.wait_for(2000, 30)
        assert len(live.seen) == 2000, "the live consumer must see the first wave before the outage"
        signals.not_delivered.clear()
        restartable_broker.stop()
        write_wave(2000)  # written while the broker is down: the relay keeps failing, nothing is lost
        # The broker comes back only once the producer gave up on a delivery (message.timeout.ms): what it
        # gave up on must still arrive.
        assert signals.not_delivered.wait(30), "the relay felt the outage"
        assert outbox_count(database_url) >= 2000
        restartable_broker.start()
        write_wave(1000)
        live.wait_for(5000, 90)
    finally:
        stop.set()
        relay.join(30)
        live.close()
        container.close()
    assert set(written) <= live.seen, f"lost {len(set(written) - live.seen)} events"
    assert outbox_count(database_url) == 0


def _event_ids_in_log(bootstrap: str) -> set[str]:
    """Every event id on the access topic, read from each partition's first offset to the end offset it has
    now."""
    reader = TopicReader({"bootstrap.servers": bootstrap}, [ACCESS_TOPIC], from_beginning=True)
    try:
        return {event.body["eventId"] for event in reader.read_to_end(timeout_s=30)}
    finally:
        reader.close()


FIRST_WAVE, IN_FLIGHT = 2_000, 18_000


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_broker_stopped_with_thousands_of_events_in_flight_loses_none(
    settings: Settings, database_url: str, proxied_broker: ProxiedBroker
) -> None:
    """The broker's log is read just before it stops and again after the relay emptied the outbox into the
    restarted broker (the same log directory): the first read holds the first wave only, the second every
    event. The relay's connections are held at the proxy before the second wave, so that thousands of events
    are handed to the producer and unacknowledged (on the wire, or still queued in it) when the broker stops,
    and nothing lands in its log between the read and the stop."""
    overrides = {
        "kafka_bootstrap_servers": proxied_broker.bootstrap,
        # Longer than the stall before the stop (handing 18,000 events to the producer takes the relay a
        # while), so that no delivery times out and no new producer connects around the stalled connections.
        "kafka_config": '{"message.timeout.ms": "30000"}',
    }
    container = Container(settings.model_copy(update=overrides))
    container.connections.ensure_topics()
    written = [_message(uuid.uuid4(), n) for n in range(FIRST_WAVE + IN_FLIGHT)]
    relay = container.jobs.outbox_relay()
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _write_in_chunks(database_url, written[:FIRST_WAVE])
        wait_until(lambda: outbox_count(database_url) == 0, "the first wave was acknowledged", timeout_s=30)
        proxied_broker.proxy.stall(new_connections_too=False)  # the relay's connections, not the reader's
        _write_in_chunks(database_url, written[FIRST_WAVE:])
        # What the relay handed to the producer and has no answer for: what the stop hits.
        wait_until(lambda: relay.in_flight == IN_FLIGHT, "the second wave is in flight", timeout_s=30)
        before_the_stop = _event_ids_in_log(proxied_broker.bootstrap)
        in_flight_at_the_stop = relay.in_flight
        proxied_broker.stop()
        proxied_broker.restart()
        proxied_broker.proxy.restore()
        wait_until(lambda: outbox_count(database_url) == 0, "the relay emptied the outbox", timeout_s=45)
        after_the_restart = _event_ids_in_log(proxied_broker.bootstrap)
    finally:
        stop.set()
        thread.join(30)
        container.close()
    assert before_the_stop == {str(m.event_id) for m in written[:FIRST_WAVE]}
    assert in_flight_at_the_stop == IN_FLIGHT
    lost = {str(m.event_id) for m in written} - after_the_restart
    assert not lost, f"lost {len(lost)} events"
    assert outbox_count(database_url, "outbox_dead_letters") == 0


def _write_in_chunks(database_url: str, messages: list[OutboxMessage]) -> None:
    for start in range(0, len(messages), 1000):
        _write(database_url, messages[start : start + 1000])


def test_two_outboxes_given_one_transactional_id_are_told_so_while_each_still_publishes(
    settings: Settings, database_url: str, postgres_admin_url: str
) -> None:
    """An operator set one `transactional.id` in PIN_IDENTITY_KAFKA_CONFIG for two deployments (two
    databases, one cluster): each relay's producer fences the other's, again and again. Each says so (log,
    /readyz); no event is lost meanwhile."""
    shared = settings.model_copy(
        update={"kafka_config": '{"transactional.id": "pin-identity-shared-by-two"}'}
    )
    with scratch_database(postgres_admin_url) as other_url:
        outboxes = [database_url, other_url]
        containers = [Container(shared.model_copy(update={"database_url": url})) for url in outboxes]
        signals = [RelaySignals(), RelaySignals()]
        relays = [_run_relay(container, told) for container, told in zip(containers, signals, strict=True)]
        keys = [uuid.uuid4() for _ in range(20)]
        try:
            for n in range(200):  # each relay keeps a transaction open, for the other's start to fence
                for url in outboxes:
                    _write(url, [_message(key, n) for key in keys])
                if all(told.id_shared.is_set() for told in signals):
                    break
                holds_within(lambda: False, 0.1)
            assert all(told.id_shared.wait(60) for told in signals), "each relay says the id is shared"
            for told in signals:
                warning = told.readiness_warning()
                assert warning is not None and "uses its transactional.id" in warning
            for url in outboxes:
                wait_until(lambda url=url: outbox_count(url) == 0, "each outbox is published", timeout_s=60)
        finally:
            for stop, thread in relays:
                stop.set()
                thread.join(30)
            for container in containers:
                container.close()

"""What the relay says about the outbox's writers: a transaction that took an outbox id and never commits
holds publishing (named within seconds, measured by a gauge, everything published once it ends), and an id
sequence restarted below the relay's read position is noticed and read from the start again."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from structlog.testing import capture_logs

from pin_identity.adapters.postgres import migrate
from pin_identity.adapters.postgres.outbox_queue import PostgresOutboxQueue
from pin_identity.adapters.postgres.outbox_writer import write_outbox
from pin_identity.composition import Container
from pin_identity.composition.connections import Connections
from pin_identity.config import RelaySettings, Settings
from pin_identity.domain.events import OutboxMessage
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.observability import metrics
from tests.support import seed
from tests.support.databases import create_database
from tests.support.kafka_tap import EventTap
from tests.support.older_postgres import older_postgres, older_postgres_bin
from tests.support.relay import RelaySignals, access_message, outbox_count
from tests.support.waiting import wait_until

# The backlog (and the writer holding publishing) is read every 0.2 s, and a writer open 1 s is named: the
# production figures are 5 s and 10 s, the mechanism the same.
FAST_LOOKS = RelaySettings(backlog_every_s=0.2)


def _message(key: uuid.UUID, n: int) -> OutboxMessage:
    return access_message(key, {"n": n})


def _write(database_url: str, *messages: OutboxMessage) -> None:
    with psycopg.connect(database_url) as conn:
        write_outbox(conn, list(messages))


@pytest.fixture
def relay(container: Container) -> Iterator[RelaySignals]:
    signals = RelaySignals(held_after_s=1.0)
    stop = threading.Event()
    thread = threading.Thread(
        target=container.jobs.outbox_relay(FAST_LOOKS, signals).run, args=(stop,), daemon=True
    )
    thread.start()
    yield signals
    stop.set()
    thread.join(30)


def _gauge(name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def test_a_writer_that_never_commits_is_named_measured_and_everything_goes_once_it_ends(
    container: Container, tap: EventTap, database_url: str
) -> None:
    held_key, behind_key = uuid.uuid4(), uuid.uuid4()
    ours = {str(held_key), str(behind_key)}
    with psycopg.connect(database_url, application_name="hung-request") as hung, capture_logs() as logs:
        write_outbox(hung, [_message(held_key, 1)])  # took an outbox id; left open, as a hung request
        hung_pid = hung.info.backend_pid
        _write(database_url, _message(behind_key, 1))  # committed, but after the open writer's id
        signals = RelaySignals(held_after_s=1.0)
        stop = threading.Event()
        relay = threading.Thread(
            target=container.jobs.outbox_relay(FAST_LOOKS, signals).run, args=(stop,), daemon=True
        )
        relay.start()
        try:
            wait_until(
                lambda: any(line["event"] == "outbox-publishing-held" for line in logs),
                "the relay names the writer holding publishing",
                timeout_s=15,
            )
            held = next(line for line in logs if line["event"] == "outbox-publishing-held")
            assert (held["pid"], held["application_name"]) == (hung_pid, "hung-request")
            assert held["transaction_s"] >= 1.0
            assert _gauge("identity_outbox_publishing_held_seconds") >= 1.0
            assert tap.settle(lambda e: e.key in ours, quiet_s=0.5) == []  # nothing overtakes the writer
            hung.commit()
            events = tap.wait_for(lambda e: e.key in ours, 2, timeout_s=30)
            wait_until(
                lambda: any(line["event"] == "outbox-publishing-resumed" for line in logs),
                "the relay says publishing goes on",
            )
        finally:
            stop.set()
            relay.join(30)
    assert sorted(e.key for e in events) == sorted(ours)  # two keys: their partitions are read in any order
    assert _gauge("identity_outbox_publishing_held_seconds") < 1.0
    assert outbox_count(database_url) == 0


def _sequence_locks(database_url: str, application_name: str) -> list[str]:
    """The modes in which the sessions of `application_name` hold the outbox id sequence's lock."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT l.mode FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE a.application_name = %s"
            " AND l.relation = 'identity.outbox_events_id_seq'::regclass ORDER BY l.mode",
            (application_name,),
        ).fetchall()
    return [mode for (mode,) in rows]


def test_a_session_that_only_reads_the_id_sequence_holds_nothing_back(
    connections: Connections, tap: EventTap, database_url: str, relay: RelaySignals
) -> None:
    """A transaction that read the sequence (a person in psql, a report; pg_dump 15-17 reads every sequence
    so, inside its one transaction, for the length of the dump) holds its lock until it ends, in the mode of
    a read: it takes no id, so the relay must not wait for it, nor name it as a writer."""
    ours = [_message(uuid.uuid4(), n) for n in range(20)]
    with psycopg.connect(database_url, application_name="reads-the-sequence") as reader:
        reader.execute("SELECT last_value FROM identity.outbox_events_id_seq")  # the transaction stays open
        assert _sequence_locks(database_url, "reads-the-sequence") == ["AccessShareLock"]
        _write(database_url, *ours)
        tap.wait_for(lambda e: e.key in {m.key for m in ours}, 20, timeout_s=15)
        backlog_reader = PostgresOutboxQueue(connections.database)
        try:
            assert backlog_reader.backlog().held_by is None
        finally:
            backlog_reader.reset()
        assert _sequence_locks(database_url, "reads-the-sequence") == ["AccessShareLock"]  # still open


@pytest.fixture(scope="module")
def older_server() -> Iterator[tuple[Path, str]]:
    """A PostgreSQL 15-17 server (Debian's) beside the embedded 18: its bin directory and admin URL."""
    bindir = older_postgres_bin()
    with older_postgres(bindir) as admin_url:
        yield bindir, admin_url


def test_a_pg_dump_of_postgresql_15_to_17_holds_nothing_back_while_a_role_changes(
    older_server: tuple[Path, str], broker: str, tap: EventTap, tmp_path: Path
) -> None:
    """pg_dump 15-17 reads every sequence with `SELECT last_value` in its one transaction, and keeps that open
    for the whole dump (here blocked on its output, as a dump written slowly): events of a role changed
    meanwhile are published while it runs. pg_dump 18 reads sequences otherwise; the embedded server is 18."""
    bindir, admin_url = older_server
    url = create_database(admin_url, "pin_identity", template=None)
    migrate.upgrade(url)
    container = Container(
        Settings(database_url=url, kafka_bootstrap_servers=broker, data_dir=tmp_path, worker_http_port=0)
    )
    _, role_id, users = seed.bulk_held_role(container.stores.identity_transactions, url, 2000)
    holders = {str(user) for user in users}
    stop = threading.Event()
    relay = threading.Thread(target=container.jobs.outbox_relay(FAST_LOOKS).run, args=(stop,), daemon=True)
    relay.start()
    # Its output is not read until the end: the dump (schema and 4,000 rows, past a pipe's 64 KiB) waits.
    dump = subprocess.Popen([bindir / "pg_dump", "-d", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _sequence_locks(url, "pg_dump") == ["AccessShareLock"], "pg_dump read it")
        seed.change_permissions(
            container.stores.identity_transactions, role_id, ["deals.write"], FanOutPolicy(5000)
        )
        tap.wait_for(lambda e: e.key in holders, len(holders), timeout_s=30)
        assert dump.poll() is None  # still dumping, its read of the sequence held
    finally:
        output, errors = dump.communicate(timeout=60)
        stop.set()
        relay.join(30)
        container.close()
    assert dump.returncode == 0, errors.decode()
    assert b"SELECT pg_catalog.setval('identity.outbox_events_id_seq'" in output


@pytest.mark.parametrize(
    "restart",
    [
        "ALTER SEQUENCE identity.outbox_events_id_seq RESTART WITH 1",
        "TRUNCATE identity.outbox_events RESTART IDENTITY",
    ],
    ids=["alter-sequence", "truncate"],
)
def test_an_id_sequence_restarted_below_the_read_position_is_reported_and_read_again(
    container: Container, tap: EventTap, database_url: str, relay: RelaySignals, restart: str
) -> None:
    before = [_message(uuid.uuid4(), n) for n in range(50)]
    _write(database_url, *before)
    tap.wait_for(lambda e: e.key in {m.key for m in before}, 50)
    # Published and removed: a DBA who restarts the sequence of an emptied outbox hands its ids out again.
    wait_until(lambda: outbox_count(database_url) == 0, "the published rows are removed")
    resets = _gauge("identity_outbox_id_resets_total")
    with capture_logs() as logs:
        with psycopg.connect(database_url, autocommit=True) as dba:
            dba.execute(restart)
        after = [_message(uuid.uuid4(), n) for n in range(5)]
        _write(database_url, *after)  # ids 1..5: below every id the relay has read
        tap.wait_for(lambda e: e.key in {m.key for m in after}, 5, timeout_s=30)
    went_back = [line for line in logs if line["event"] == "outbox-ids-went-back"]
    assert went_back and went_back[0]["read_up_to"] >= 50 and went_back[0]["sequence_at"] <= 5
    assert _gauge("identity_outbox_id_resets_total") == resets + 1

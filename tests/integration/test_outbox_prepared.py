"""Prepared transactions (two-phase commit) beside the outbox: another application's hold nothing back; one
that took an outbox id holds publishing until it is committed, and the relay says so on /readyz with its
gid."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pin_identity.adapters.postgres import migrate
from pin_identity.adapters.postgres.embedded_postgres import (
    ensure_embedded_postgres,
    restart_embedded_postgres,
    stop_embedded_postgres,
)
from pin_identity.adapters.postgres.outbox_writer import write_outbox
from pin_identity.composition import Container
from pin_identity.config import RelaySettings, Settings
from tests.support.kafka_tap import EventTap
from tests.support.relay import RelaySignals, access_message
from tests.support.waiting import wait_until


@pytest.fixture
def two_phase_url(tmp_path: Path) -> Iterator[str]:
    """A server of the test's own that allows prepared transactions (the session's allows none)."""
    data_dir = tmp_path / "two-phase"
    url = ensure_embedded_postgres(data_dir)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_prepared_transactions = 4")
    restart_embedded_postgres(data_dir)
    migrate.upgrade(url)
    yield url
    with psycopg.connect(url, autocommit=True) as conn:  # a prepared transaction outlives its session
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall():
            conn.execute(f"ROLLBACK PREPARED '{gid}'")
    stop_embedded_postgres(data_dir)


def _prepare(url: str, gid: str, *, takes_an_outbox_id: bool, key: uuid.UUID) -> None:
    with psycopg.connect(url) as conn:
        if takes_an_outbox_id:
            write_outbox(conn, [access_message(key, {"n": 1})])
        else:
            conn.execute("CREATE TABLE IF NOT EXISTS public.another_application (n int)")
            conn.execute("INSERT INTO public.another_application VALUES (1)")
        conn.execute(f"PREPARE TRANSACTION '{gid}'")


def test_a_prepared_transaction_holds_publishing_only_while_it_holds_an_outbox_id(
    settings: Settings, two_phase_url: str, tap: EventTap
) -> None:
    container = Container(settings.model_copy(update={"database_url": two_phase_url}))
    signals = RelaySignals(held_after_s=0.5)
    relay = container.jobs.outbox_relay(RelaySettings(backlog_every_s=0.2), signals)
    stop = threading.Event()
    running = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    early, held, late = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    try:
        running.start()
        _prepare(two_phase_url, "another-application", takes_an_outbox_id=False, key=early)
        with psycopg.connect(two_phase_url) as conn:
            write_outbox(conn, [access_message(early, {"n": 1})])
        tap.wait_for(
            lambda e: e.key == str(early), 1
        )  # another application's prepared transaction holds nothing

        _prepare(two_phase_url, "pin-two-phase", takes_an_outbox_id=True, key=held)
        with psycopg.connect(two_phase_url) as conn:
            write_outbox(conn, [access_message(late, {"n": 2})])
        wait_until(lambda: "pin-two-phase" in (signals.readiness_warning() or ""), "readiness names the gid")
        said = signals.readiness_warning()
        assert tap.settle(lambda e: e.key == str(late), quiet_s=1.0) == []  # behind the prepared id: waits

        with psycopg.connect(two_phase_url, autocommit=True) as conn:
            conn.execute("COMMIT PREPARED 'pin-two-phase'")
        arrived = tap.wait_for(lambda e: e.key in (str(held), str(late)), 2)
        wait_until(lambda: signals.readiness_warning() is None, "readiness clears")
    finally:
        stop.set()
        running.join(30)
        container.close()

    assert said is not None and "prepared transaction 'pin-two-phase'" in said
    assert [e.key for e in arrived] == [str(held), str(late)]  # in outbox order

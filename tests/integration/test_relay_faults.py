"""The relay through faults: broker outages longer than the delivery timeout, a failover while events are in
flight, and a relay whose path to the database goes silent. The broker (or the database) sits behind a TCP
proxy on loopback that the test cuts, black-holes and restores."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from pin_identity.adapters.kafka.embedded_kafka import free_port
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.adapters.postgres.database import ConnectionLimits, Database, SilenceLimit
from pin_identity.adapters.postgres.outbox_queue import PostgresOutboxQueue
from pin_identity.adapters.postgres.outbox_writer import write_outbox
from pin_identity.composition import Container
from pin_identity.config import RelaySettings, Settings
from pin_identity.domain.events import ACCESS_TOPIC, PUBLISHED_TOPICS
from pin_identity.observability import metrics
from pin_identity.operations.ports.outbox import RelayRole
from tests.support.brokers import ProxiedBroker
from tests.support.databases import through_port, unix_socket
from tests.support.kafka_tap import ConsumedEvent, EventTap, assert_versions_never_go_back
from tests.support.relay import RelaySignals, access_message, outbox_count, read_rows
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import holds_within, wait_until

# A delivery timeout that an outage outlives in seconds (production keeps the default minute), requests that
# time out inside it, and fast reconnects. Idempotence stays on, as in production (the relay's transactions
# need it): a producer whose in-flight requests time out has its epoch bumped (KIP-360) and goes on, and the
# transaction they were in is aborted and sent again whole.
FAST_TIMEOUTS = (
    '{"message.timeout.ms": "3000", "request.timeout.ms": "1000",'
    ' "reconnect.backoff.ms": "20", "reconnect.backoff.max.ms": "100"}'
)


@pytest.fixture
def proxied_broker(proxied_broker: ProxiedBroker) -> ProxiedBroker:
    """The test's own broker behind a proxy (conftest's), with the topics the relay publishes to."""
    ensure_topics({"bootstrap.servers": proxied_broker.bootstrap}, PUBLISHED_TOPICS, TopicLayout(3, 1))
    return proxied_broker


def _write_versions(database_url: str, keys: list[uuid.UUID], version: int) -> None:
    with psycopg.connect(database_url) as conn:
        write_outbox(conn, [access_message(key, {"version": version}) for key in keys])


def _assert_versions_only_grow(events: list[ConsumedEvent], keys: list[uuid.UUID], *, last: int) -> None:
    """Per key, in topic order: versions never go back, and the last is `last`."""
    versions = assert_versions_never_go_back((event.key, event.payload["version"]) for event in events)
    assert {key: seen[-1] for key, seen in versions.items()} == {str(key): last for key in keys}


def _timeouts() -> float:
    """Retries the relay counted because deliveries timed out (a message's, or its transaction's)."""
    return sum(
        metrics.outbox_publish_errors_total.labels(reason=reason)._value.get()
        for reason in ("_MSG_TIMED_OUT", "_TIMED_OUT")
    )


@pytest.mark.slow
def test_one_keys_events_never_reorder_through_an_outage_longer_than_the_delivery_timeout(
    settings: Settings, database_url: str, proxied_broker: ProxiedBroker
) -> None:
    overrides = {"kafka_bootstrap_servers": proxied_broker.bootstrap, "kafka_config": FAST_TIMEOUTS}
    container = Container(settings.model_copy(update=overrides))
    tap = EventTap(proxied_broker.bootstrap, [ACCESS_TOPIC])
    keys = [uuid.uuid4() for _ in range(300)]
    timeouts_before = _timeouts()
    stop, signals = threading.Event(), RelaySignals()
    outbox_relay = container.jobs.outbox_relay(observer=signals)
    relay = threading.Thread(target=outbox_relay.run, args=(stop,), daemon=True)
    relay.start()
    try:
        _write_versions(database_url, keys, 1)
        tap.wait_for(lambda e: True, len(keys))  # the producer is connected and delivering
        wait_until(lambda: outbox_count(database_url) == 0, "version 1 is settled")
        proxied_broker.proxy.stall()
        signals.not_delivered.clear()
        _write_versions(database_url, keys, 2)
        wait_until(lambda: proxied_broker.proxy.held_bytes() > 0, "version 2 is sent into the stall")
        # Version 3 is written while version 2 is in flight, unanswered, and the broker comes back as soon as
        # version 2 expired (librdkafka's own delivery timeout: 3 s): a relay that had handed both to the
        # producer would see 3 delivered and then send 2 again behind it. This one holds each key's version 3
        # until its version 2 is answered.
        _write_versions(database_url, keys, 3)
        wait_until(lambda: outbox_relay.held == len(keys), "version 3 is queued behind version 2")
        assert not signals.not_delivered.is_set(), "version 2 was still unanswered when version 3 was read"
        assert signals.not_delivered.wait(30), "version 2 expired in the stall"
        proxied_broker.proxy.restore()
        events = tap.wait_for(lambda e: e.payload["version"] == 3, len(keys), timeout_s=60)
        wait_until(lambda: outbox_count(database_url) == 0, "the outbox is drained", timeout_s=60)
        events = tap.read_to_end(lambda e: True)
    finally:
        stop.set()
        relay.join(30)
        tap.close()
        container.close()
    assert _timeouts() > timeouts_before, "the outage must outlast the delivery timeout to mean anything"
    _assert_versions_only_grow(events, keys, last=3)


def _relay_lock_holder(database_url: str) -> int | None:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND ((classid::bigint << 32) | objid::bigint)"
            " = hashtextextended('pin-identity:lock:outbox-relay', 0)"
        ).fetchone()
    return int(row[0]) if row else None


@pytest.mark.slow
def test_a_relay_that_lost_its_session_lands_nothing_behind_the_relay_that_took_over(
    settings: Settings, database_url: str, proxied_broker: ProxiedBroker
) -> None:
    configured = settings.model_copy(update={"kafka_bootstrap_servers": proxied_broker.bootstrap})
    first, second = Container(configured), Container(configured)
    keys = [uuid.uuid4() for _ in range(200)]
    stop = threading.Event()
    # The standby looks for the lock every 50 ms: it takes over before the old relay could take it back.
    quick_standby = RelaySettings(standby_wait_s=0.05)
    relays = [
        threading.Thread(target=c.jobs.outbox_relay(quick_standby).run, args=(stop,), daemon=True)
        for c in (first, second)
    ]
    relays[0].start()
    tap: EventTap | None = None
    try:
        _write_versions(database_url, keys, 1)
        wait_until(lambda: outbox_count(database_url) == 0, "version 1 is published", timeout_s=60)
        active = _relay_lock_holder(database_url)
        relays[1].start()  # stands by
        # The active relay's broker connections stall (a partition on its side only); it sends version 2
        # into the stall, then loses its database session, and with it the lock.
        proxied_broker.proxy.stall(new_connections_too=False)
        _write_versions(database_url, keys, 2)
        wait_until(lambda: proxied_broker.proxy.held_bytes() > 0, "version 2 is sent into the stall")
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (active,))
        wait_until(lambda: _relay_lock_holder(database_url) not in (None, active), "the standby took over")
        tap = EventTap(proxied_broker.bootstrap, [ACCESS_TOPIC])
        wait_until(lambda: outbox_count(database_url) == 0, "the new relay published version 2", timeout_s=60)
        _write_versions(database_url, keys, 3)
        wait_until(lambda: outbox_count(database_url) == 0, "version 3 is published", timeout_s=60)
        proxied_broker.proxy.restore()  # whatever the old relay's producer still held reaches the broker now
        events = tap.settle(lambda e: True, quiet_s=2.0)
    finally:
        stop.set()
        for relay in relays:
            relay.join(30)
        if tap is not None:
            tap.close()
        first.close()
        second.close()
    _assert_versions_only_grow(events, keys, last=3)


RELAY = [sys.executable, "-m", "pin_identity.entrypoints.cli", "worker", "--jobs", "outbox-relay"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_frozen_relay_lands_nothing_after_the_relay_that_took_over(
    subprocess_env: dict[str, str], database_url: str, proxied_broker: ProxiedBroker, tmp_path: Path
) -> None:
    """A relay process frozen (SIGSTOP) while its producer holds version 2, its session killed; another relay
    takes over and publishes versions 2 and 3; then the frozen one resumes (SIGCONT) with the broker
    reachable again. Its producer was fenced at the broker when the new relay started its own under the
    outbox's transactional.id: nothing it held lands, so no key's version 2 comes after its version 3."""
    env = {**subprocess_env, "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": proxied_broker.bootstrap}
    keys = [uuid.uuid4() for _ in range(200)]
    frozen_log, taker_log = tmp_path / "frozen.log", tmp_path / "taker.log"
    with frozen_log.open("wb") as log:
        frozen = subprocess.Popen(RELAY, env=env, stderr=log)
    taker: subprocess.Popen[bytes] | None = None
    try:
        _write_versions(database_url, keys, 1)
        wait_until(lambda: outbox_count(database_url) == 0, "version 1 is published", timeout_s=60)
        session = _relay_lock_holder(database_url)
        # The relay's broker connections stall; it hands version 2 to its producer, which sends it into the
        # stall; then the process is frozen with it, and its database session (so its lock) is killed.
        proxied_broker.proxy.stall(new_connections_too=False)
        _write_versions(database_url, keys, 2)
        wait_until(lambda: proxied_broker.proxy.held_bytes() > 0, "version 2 is sent into the stall")
        frozen.send_signal(signal.SIGSTOP)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (session,))
        with taker_log.open("wb") as log:
            taker = subprocess.Popen(RELAY, env=env, stderr=log)
        wait_until(lambda: _relay_lock_holder(database_url) not in (None, session), "a relay took over")
        wait_until(lambda: outbox_count(database_url) == 0, "the new relay published version 2", timeout_s=60)
        _write_versions(database_url, keys, 3)
        wait_until(lambda: outbox_count(database_url) == 0, "version 3 is published", timeout_s=60)
        proxied_broker.proxy.restore()  # what the frozen producer had on the wire reaches the broker now
        frozen.send_signal(signal.SIGCONT)
        wait_until(
            lambda: b"outbox-relay-failed" in frozen_log.read_bytes(),
            "the resumed relay finds its session gone and stands down",
        )
    finally:
        for relay in (frozen, taker):
            if relay is not None:
                relay.send_signal(signal.SIGCONT)
                relay.terminate()
                relay.wait(30)
    tap = EventTap(proxied_broker.bootstrap, [ACCESS_TOPIC], from_beginning=True)
    try:
        events = tap.read_to_end(lambda e: True)
    finally:
        tap.close()
    _assert_versions_only_grow(events, keys, last=3)


class _VersionStream:
    """Writes version 2, 3, ... of every key, a round every 0.1 s, until stopped: whenever the test cuts a
    path, the relay is in the middle of publishing."""

    def __init__(self, database_url: str, keys: list[uuid.UUID]):
        self._database_url, self._keys = database_url, keys
        self.written = 1  # the last version committed for every key
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        while not self._stop.is_set():
            _write_versions(self._database_url, self._keys, self.written + 1)
            self.written += 1
            self._stop.wait(0.1)

    def stop(self) -> int:
        """The last version written, once writing stopped."""
        self._stop.set()
        self._thread.join(30)
        return self.written


def _healthz(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code
    except httpx.TransportError:
        return None


def _relay_sessions(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'pin-identity-outbox-relay'"
        ).fetchone()
    return int(row[0]) if row else 0


HANDOVER_BOUND_S = 30.0


def _what_the_relays_did(database_url: str, *logs: Path) -> str:
    """The database's sessions and the relays' logs, for a handover that did not happen."""
    with psycopg.connect(database_url) as conn:
        sessions = conn.execute(
            "SELECT pid, application_name, state, wait_event_type, wait_event, backend_xid,"
            " now() - xact_start AS in_transaction, left(query, 80) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    lines = [f"session: {session}" for session in sessions]
    for log in logs:
        lines += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()[-40:]]
    return "\n".join(lines)


def _watch_the_handover(
    tap: EventTap, keys: list[uuid.UUID], *, after_version: int, healthz_port: int, since: float
) -> dict[str, float]:
    """Seconds from `since` until the standby published a version written after the path went silent, and
    until the silent relay's /healthz failed; whichever did not happen within the bound is missing."""
    ours, seen, looked_at = {str(key) for key in keys}, {}, len(tap.received)

    def both_seen() -> bool:
        nonlocal looked_at
        tap.poll(0.2)
        new, looked_at = tap.received[looked_at:], len(tap.received)
        later = any(e.key in ours and e.payload["version"] > after_version for e in new)
        if "published" not in seen and later:
            seen["published"] = time.monotonic() - since
        if "healthz" not in seen and _healthz(healthz_port) == 503:
            seen["healthz"] = time.monotonic() - since
        return len(seen) == 2

    holds_within(both_seen, since + HANDOVER_BOUND_S - time.monotonic(), every_s=0)
    return seen


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_relay_whose_database_path_goes_silent_hands_over_within_30_s(
    subprocess_env: dict[str, str], database_url: str, broker: str, tmp_path: Path
) -> None:
    """The active relay reaches PostgreSQL through a proxy that black-holes the path mid-stream (nothing is
    refused or closed: bytes and closes are held). The server ends the silent session, so the standby gets
    the lock and publishes within 30 s, and the silent relay's /healthz fails within the same bound. When the
    path comes back, the old relay finds its session gone and stands down; its producer was fenced by the new
    relay's, so no key's version goes back on the topic."""
    keys = [uuid.uuid4() for _ in range(100)]
    proxy, healthz_port = TcpProxy(free_port(), unix_socket(database_url)), free_port()
    silent_env = {
        **subprocess_env,
        "PIN_IDENTITY_DATABASE_URL": through_port(database_url, proxy.listen_port),
        "PIN_IDENTITY_WORKER_HTTP_PORT": str(healthz_port),
    }
    tap = EventTap(broker, [ACCESS_TOPIC])
    silent_log, standby_log = tmp_path / "silent.log", tmp_path / "standby.log"
    with silent_log.open("wb") as log:
        silent = subprocess.Popen(RELAY, env=silent_env, stderr=log)
    standby: subprocess.Popen[bytes] | None = None
    stream: _VersionStream | None = None
    try:
        _write_versions(database_url, keys, 1)
        wait_until(lambda: outbox_count(database_url) == 0, "version 1 is published", timeout_s=60)
        with standby_log.open("wb") as log:
            standby = subprocess.Popen(RELAY, env=subprocess_env, stderr=log)
        wait_until(lambda: _relay_sessions(database_url) == 2, "the second relay stands by", timeout_s=60)
        assert _healthz(healthz_port) == 200
        stream = _VersionStream(database_url, keys)
        ours = {str(key) for key in keys}
        tap.wait_for(lambda e: e.key in ours and e.payload["version"] >= 3, 1)  # the stream is under way
        proxy.black_hole()
        silent_at, written = time.monotonic(), stream.written
        # A version after the next one was committed after the path went silent: only the standby can
        # publish it.
        handover = _watch_the_handover(
            tap, keys, after_version=written + 1, healthz_port=healthz_port, since=silent_at
        )
        print(f"black hole at version {written}: {handover}")
        assert "published" in handover, (
            f"the standby published nothing within 30 s ({handover}; the stream at {stream.written}, the"
            f" topic at {max(e.payload['version'] for e in tap.received if e.key in ours)})\n"
            + _what_the_relays_did(database_url, silent_log, standby_log)
        )
        assert "healthz" in handover, f"the silent relay's /healthz did not fail within 30 s ({handover})"
        proxy.restore()
        wait_until(
            lambda: b"outbox-relay-failed" in silent_log.read_bytes(),
            "the old relay finds its session gone and stands down",
        )
        wait_until(lambda: _healthz(healthz_port) == 200, "the old relay is alive again (standing by)")
        last = stream.stop()
        wait_until(lambda: outbox_count(database_url) == 0, "the stream is published", timeout_s=60)
        events = tap.read_to_end(lambda e: True)
    finally:
        if stream is not None:
            stream.stop()
        proxy.restore()
        for relay in (silent, standby):
            if relay is not None:
                relay.terminate()
                relay.wait(30)
        tap.close()
        proxy.close()
    _assert_versions_only_grow([e for e in events if e.key in ours], keys, last=last)


def _removing(database_url: str, pid: int | None) -> bool:
    """Whether the session `pid` is inside a removal: its DELETE ran, and its transaction waits for a sync."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = %s AND mode = 'RowExclusiveLock'"
            " AND relation = 'identity.outbox_events'::regclass",
            (pid,),
        ).fetchone()
    return row == (1,)


def test_a_relay_silent_between_a_removal_and_its_sync_loses_its_session_within_its_limit(
    database_url: str,
) -> None:
    """The relay sends a removal behind each read without waiting for it; should the relay go silent right
    then, the server waits for the sync in the middle of a transaction, where no idle timeout runs. The
    relay's SilenceLimit ends that session too (transaction_timeout), and the lock goes with it."""
    database = Database(database_url, limits=ConnectionLimits()).open()
    queue = PostgresOutboxQueue(database, SilenceLimit(1.0))
    try:
        _write_versions(database_url, [uuid.uuid4(), uuid.uuid4()], 1)
        assert queue.try_become_active() is not RelayRole.STANDBY
        session = _relay_lock_holder(database_url)
        [first] = read_rows(queue, 1, 0)
        queue.settle([first.outbox_id], {})
        assert len(read_rows(queue, 1, first.outbox_id)) == 1  # the removal of the first follows the read
        wait_until(lambda: _removing(database_url, session), "the removal waits for its sync")
        wait_until(
            lambda: _relay_lock_holder(database_url) is None,
            "the server ended the silent session, and the lock is free",
            timeout_s=5,
        )
        with pytest.raises(psycopg.OperationalError):
            queue.heartbeat()
    finally:
        queue.reset()
        database.close()


def test_a_relay_waiting_on_a_silent_path_is_stalled_and_its_session_ended_within_its_limit(
    database_url: str,
) -> None:
    """Behind a black hole the relay's heartbeat waits for an answer with nothing to tell it the path is
    gone (TCP to the proxy is fine). Within its SilenceLimit the server ends the session, whose statements
    stopped arriving (the lock is free for a standby), and the relay shows stalled (a worker's /healthz
    fails on it). Once the path is back, the wait ends with the server's error."""
    proxy = TcpProxy(free_port(), unix_socket(database_url))
    database = Database(through_port(database_url, proxy.listen_port), limits=ConnectionLimits()).open()
    queue = PostgresOutboxQueue(database, SilenceLimit(1.0))
    outcome: list[BaseException] = []

    def heartbeat() -> None:
        try:
            queue.heartbeat()
        except psycopg.Error as exc:
            outcome.append(exc)

    waiting = threading.Thread(target=heartbeat, daemon=True)
    try:
        assert queue.try_become_active() is not RelayRole.STANDBY
        assert not queue.stalled()
        proxy.black_hole()
        waiting.start()
        wait_until(queue.stalled, "the relay shows stalled", timeout_s=5)
        wait_until(lambda: _relay_lock_holder(database_url) is None, "the lock is free", timeout_s=5)
        assert waiting.is_alive(), "the relay's heartbeat should still be waiting behind the black hole"
        proxy.restore()
        waiting.join(10)
        assert [type(exc) for exc in outcome] == [psycopg.OperationalError]
        assert not queue.stalled()
    finally:
        proxy.restore()
        queue.reset()
        database.close()
        proxy.close()

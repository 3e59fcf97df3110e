"""The relay's memory under a fan-out of heavy users and a stalled broker: a role of 2,000 users holding
about 300 assignments each is about 100 KB an event, 200 MB in all. The relay's worker, in its pod's
budget (PIN_IDENTITY_RELAY_MEMORY_MB=64 of a 256 MiB limit), reads and holds what fits, waits while the
broker takes nothing, and publishes every event once it does; its peak resident memory stays under the
pod's limit."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import psycopg

from pin_identity.adapters.postgres.outbox_writer import write_outbox
from tests.support.brokers import proxied_broker
from tests.support.kafka_tap import EventTap
from tests.support.relay import access_message, outbox_count, relay_worker
from tests.support.waiting import wait_until

HEAVY_USERS = 2_000
EVENT_BYTES = 100_000
POD_LIMIT_MB = 256


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM)."""
    status = Path(f"/proc/{pid}/status").read_text()
    [line] = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) / 1024


def _write_heavy_fan_out(database_url: str) -> set[str]:
    """The events of the fan-out, as its pages write them (500 a transaction); their event ids."""
    written: set[str] = set()
    for _ in range(HEAVY_USERS // 500):
        messages = [
            access_message(uuid.uuid4(), {"assignments": os.urandom(EVENT_BYTES // 2).hex()})
            for _ in range(500)
        ]
        with psycopg.connect(database_url) as conn:
            write_outbox(conn, messages)
        written |= {str(message.event_id) for message in messages}
    return written


def _write_and_publish_one(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        write_outbox(conn, [access_message(uuid.uuid4(), {})])
    wait_until(lambda: outbox_count(database_url) == 0, "the relay publishes", timeout_s=60)


def test_a_heavy_fan_out_through_a_stalled_broker_stays_in_the_pods_memory_and_loses_nothing(
    subprocess_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    with proxied_broker(tmp_path / "broker") as broker:
        env = {
            **subprocess_env,
            "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
            "PIN_IDENTITY_RELAY_MEMORY_MB": "64",
        }
        with relay_worker(env, tmp_path) as (_, worker, log):
            _write_and_publish_one(database_url)  # the relay's producer has its id and its connections
            broker.proxy.stall()
            written = _write_heavy_fan_out(database_url)
            wait_until(lambda: b"outbox-broker-silent" in log.read_bytes(), "the relay waits on the stall")
            broker.proxy.restore()
            wait_until(lambda: outbox_count(database_url) == 0, "every event is published", timeout_s=180)
            peak_mb = _peak_rss_mb(worker.pid)
        tap = EventTap(broker.bootstrap, ["pin.identity.access.v1"], from_beginning=True)
        try:
            published = {event.body["eventId"] for event in tap.read_to_end(lambda e: True, timeout_s=60)}
        finally:
            tap.close()
    print(f"relay worker's peak RSS: {peak_mb:.0f} MiB for {HEAVY_USERS} events of {EVENT_BYTES // 1000} KB")
    assert written <= published, f"lost {len(written - published)} events"
    assert outbox_count(database_url, "outbox_dead_letters") == 0
    assert peak_mb < POD_LIMIT_MB

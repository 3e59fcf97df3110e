"""Drives the real outbox relay until the outbox is drained; its hooks as signals a test waits on."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.domain.events import ACCESS_TOPIC, OutboxMessage, envelope
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.jobs.outbox_relay_observer import HELD_AFTER_S, RelayObserver
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from pin_identity.operations.ports.outbox import OutboxQueue, PendingEvent
from tests.support.cli import WorkerProcess, launch_worker
from tests.support.kafka_tap import EventTap


def publish_outbox(container: Container) -> None:
    container.jobs.outbox_relay().run(threading.Event(), once=True)


def access_message(key: uuid.UUID, payload: dict[str, Any]) -> OutboxMessage:
    """An outbox row of `UserAccessChanged` for the user `key`, carrying `payload` (what the test tracks)."""
    return envelope(
        event_type="UserAccessChanged",
        topic=ACCESS_TOPIC,
        aggregate_type="User",
        aggregate_id=key,
        payload=payload,
        correlation_id=uuid.uuid4(),
        occurred_at=datetime.now(UTC),
    )


def change_permissions_inline(container: Container, role: uuid.UUID, holders: int) -> None:
    """A permission change of a role of at most `holders` users: their events are written with the change."""
    identity_changes.set_role_permissions(
        container.stores.identity_transactions,
        Context.fresh(SYSTEM_CLOCK),
        role_id=role,
        permissions=["deals.read", "deals.approve"],
        policy=FanOutPolicy(inline_threshold=holders),
    )


def users_told_of_the_change(
    bootstrap: str, role: uuid.UUID, reason: str | None = "RolePermissionsChanged"
) -> set[str]:
    """The users with an event of the role's change (`reason`: of this kind only; None: any) on the access
    topic, read whole."""
    tap = EventTap(bootstrap, [ACCESS_TOPIC], from_beginning=True)
    try:
        events = tap.read_to_end(lambda e: e.payload["changedRoleId"] == str(role))
    finally:
        tap.close()
    return {e.key for e in events if reason is None or e.payload["changeReason"] == reason}


def read_rows(queue: OutboxQueue, limit: int, after: int) -> list[PendingEvent]:
    """The relay's read of the outbox (its main lane), without a bound on bytes."""
    return queue.fetch_ready(limit, after, max_bytes=2**40).events


def outbox_count(database_url: str, table: str = "outbox_events") -> int:
    """Rows left in the outbox (or in `outbox_dead_letters`)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f"SELECT count(*) FROM identity.{table}").fetchone()
    return int(row[0]) if row else 0


class RelaySignals(RelayObserver):
    """The relay's observer (its log lines and metrics as usual) that also sets `not_delivered` when the
    broker hands events back undelivered (the producer gave up on them: an outage, a delivery timeout), and
    `topic_held` when the relay holds a topic's events because the broker does not have the topic (`held`:
    topic -> why it was not recreated; `recreated`: the topics the relay created again), and `id_shared` when
    it says a producer outside its outbox uses its transactional.id."""

    def __init__(self, *, held_after_s: float = HELD_AFTER_S) -> None:
        super().__init__(held_after_s=held_after_s)
        self.not_delivered = threading.Event()
        self.topic_held = threading.Event()
        self.held: dict[str, str] = {}
        self.recreated: list[str] = []
        self.id_shared = threading.Event()

    def delivery_failed(self, retry: Mapping[int, str]) -> None:
        super().delivery_failed(retry)
        self.not_delivered.set()

    def topic_missing(self, topic: str, reason: str) -> None:
        super().topic_missing(topic, reason)
        self.held[topic] = reason
        self.topic_held.set()

    def topic_recreated(self, topic: str) -> None:
        super().topic_recreated(topic)
        self.recreated.append(topic)

    def transactional_id_shared(self, fences: int, window_s: float) -> None:
        super().transactional_id_shared(fences, window_s)
        self.id_shared.set()


@contextmanager
def relay_worker(env: dict[str, str], tmp_path: Path, jobs: str = "outbox-relay") -> Iterator[WorkerProcess]:
    """`worker --jobs outbox-relay` (or the `jobs` given) with its HTTP port, stopped with SIGTERM (and exit
    0) at the end."""
    worker = launch_worker(env, jobs, tmp_path / "worker.log")
    try:
        yield worker
    finally:
        assert worker.stop() == 0


def readiness_warnings(base: str) -> list[str]:
    ready = httpx.get(f"{base}/readyz", timeout=5)
    assert ready.status_code == 200, "what the relay warns of (a held topic, few replicas) is no unreadiness"
    warnings: list[str] = ready.json()["warnings"]
    return warnings

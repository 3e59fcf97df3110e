"""The node that coordinates the relay's Kafka transactions is killed (SIGKILL, no controlled shutdown) while
a transaction is open and thousands of events are in flight. Another node takes over the coordinator
partition; the relay's worker stays up, every event arrives once (read_committed), each user's versions
never go back, nothing is dead-lettered, and publishing resumes within 30 s of the kill: a change made after
the kill is published, which only a transaction begun after it can do (the rows published before the kill may
still be leaving the outbox then). Meanwhile the worker's /readyz and /metrics say how long the broker has
acknowledged nothing. The relay meets a cold coordinator: no producer warms the fresh cluster's transaction
log up before it."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import httpx
import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from pin_identity.adapters.postgres.outbox_queue import PostgresOutboxQueue
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.jobs.outbox_relay_observer import SILENT_AFTER_S
from tests.support import seed
from tests.support.cluster import KafkaCluster
from tests.support.health import metric
from tests.support.kafka_tap import EventTap, assert_versions_never_go_back
from tests.support.relay import outbox_count, readiness_warnings, relay_worker
from tests.support.waiting import wait_until

HOLDERS = 1500
CHANGES = 3  # each holder's versions before the kill: three events a user, in order (and one after it)
RESUMED_WITHIN_S = 30.0
TRANSACTION_STATE = "__transaction_state"
SILENT_WARNING = r"the outbox relay has waited \d+ s for the broker to acknowledge its events"


def java_hash(text: str) -> int:
    """Java's String.hashCode, as Kafka hashes a transactional.id (UTF-16 code units, 32-bit overflow)."""
    value = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        value = (31 * value + int(unit, 16)) & 0xFFFFFFFF
    return value


def coordinator_node(bootstrap: str, transactional_id: str) -> int:
    """The node leading the transactional.id's partition of __transaction_state: Kafka's
    `Utils.abs(id.hashCode()) % transaction.state.log.num.partitions` (confluent-kafka's AdminClient has no
    find-coordinator call); the partition count is read from the cluster, not assumed."""
    topic = AdminClient({"bootstrap.servers": bootstrap}).list_topics(TRANSACTION_STATE, timeout=10)
    partitions = topic.topics[TRANSACTION_STATE].partitions
    leader: int = partitions[(java_hash(transactional_id) & 0x7FFFFFFF) % len(partitions)].leader
    return leader


@dataclass
class Outage:
    """What the worker's /metrics and /readyz showed while its events were not published."""

    base: str
    retries: float = 0.0
    unacknowledged_s: float = 0.0
    warnings: set[str] = field(default_factory=set)

    def look(self) -> None:
        scrape = httpx.get(f"{self.base}/metrics", timeout=5).text
        self.retries = max(self.retries, metric(scrape, "identity_outbox_publish_errors_total"))
        self.unacknowledged_s = max(
            self.unacknowledged_s, metric(scrape, "identity_outbox_unacknowledged_seconds")
        )
        self.warnings.update(readiness_warnings(self.base))


def _outbox_rows_after(database_url: str, outbox_id: int) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM identity.outbox_events WHERE id > %s", (outbox_id,)
        ).fetchone()
    return int(row[0]) if row else 0


def _last_outbox_id(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) FROM identity.outbox_events").fetchone()
    return int(row[0]) if row else 0


def _change(container: Container, role: UUID, version: int) -> None:
    seed.change_permissions(
        container.stores.identity_transactions,
        role,
        [f"deals.read.{version}"],
        FanOutPolicy(inline_threshold=HOLDERS),
    )


@pytest.mark.slow  # a three-node cluster, one node killed and started again: about 60 s on 2 cores
def test_killing_the_transaction_coordinator_node_mid_transaction_loses_nothing_and_publishing_resumes(
    cluster_env: dict[str, str], settings: Settings, cluster: KafkaCluster, database_url: str, tmp_path: Path
) -> None:
    began = time.monotonic()
    container = Container(settings.model_copy(update={"kafka_bootstrap_servers": cluster.bootstrap}))
    _, role, _ = seed.bulk_held_role(container.stores.identity_transactions, database_url, HOLDERS)
    for version in range(CHANGES):
        _change(container, role, version)
    expected = HOLDERS * (CHANGES + 1)
    total = outbox_count(database_url)  # the company's own event besides
    assert total >= HOLDERS * CHANGES
    with relay_worker(cluster_env, tmp_path) as (base, worker, _):
        wait_until(lambda: outbox_count(database_url) < total, "the relay commits its first transaction")
        # Only now: the relay's first transactional producer made the cluster create its transaction log.
        victim = coordinator_node(
            cluster.bootstrap, PostgresOutboxQueue(container.connections.database).transactional_id()
        )
        in_flight = outbox_count(database_url)  # the next transaction is open: these rows go once it commits
        cluster.kill(victim)
        killed_at, outage = time.monotonic(), Outage(base)
        before_change = _last_outbox_id(database_url)
        _change(container, role, CHANGES)

        def published_again() -> bool:
            outage.look()
            return _outbox_rows_after(database_url, before_change) < HOLDERS

        wait_until(published_again, "a change made after the kill is published", timeout_s=RESUMED_WITHIN_S)
        resumed_s = time.monotonic() - killed_at
        assert in_flight > 1000, f"only {in_flight} events were left to publish at the kill"
        wait_until(lambda: outbox_count(database_url) == 0, "every event is published", timeout_s=60)
        assert worker.poll() is None, "the worker stays up"
    print(
        f"node {victim} killed with {in_flight} events left; a change made after the kill published"
        f" {resumed_s:.1f} s after it;"
        f" meanwhile publish errors {outage.retries:g}, unacknowledged for {outage.unacknowledged_s:.1f} s,"
        f" /readyz warnings {sorted({re.sub(r'[0-9]+ s', 'N s', warning) for warning in outage.warnings})}"
    )
    assert outage.unacknowledged_s >= SILENT_AFTER_S
    assert any(re.fullmatch(SILENT_WARNING, warning) for warning in outage.warnings), outage.warnings
    assert outbox_count(database_url, "outbox_dead_letters") == 0
    tap = EventTap(cluster.bootstrap, [ACCESS_TOPIC], from_beginning=True)
    try:
        events = tap.read_to_end(lambda e: e.payload["changedRoleId"] == str(role), timeout_s=60)
    finally:
        tap.close()
    read = [(e.key, int(e.payload["version"])) for e in events]
    assert len(read) == len(set(read)) == expected, (
        f"{len(read)} read, {len(set(read))} distinct, of {expected}"
    )
    assert_versions_never_go_back(read)
    cluster.start(victim)
    cluster.wait_in_sync()
    container.close()
    print(f"coordinator lost, test body: {time.monotonic() - began:.1f} s")

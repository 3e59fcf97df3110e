"""Lag in time, with its alert (the spec's SLO after the handover: consumer lag under 5 minutes): talent-sync
publishes the age of the oldest Talent record it has not applied yet, from the records' timestamps, and
TalentSyncLagOverSLO fires on what it published; the outbox's oldest unpublished event's age, read while no
relay publishes, makes OutboxOldestEventTooOld fire."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Producer
from prometheus_client import REGISTRY

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.config import TalentSyncSettings
from pin_identity.domain.model import CompanyType
from pin_identity.entrypoints.admin_http.gauges import DatabaseGauges
from pin_identity.jobs.talent_sync import TalentSyncJob
from pin_identity.jobs.talent_sync_observer import TalentSyncObserver
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from tests.support import talent
from tests.support.promtool import firing_after
from tests.support.talent import TalentTopics
from tests.support.waiting import wait_until


class _Ages(TalentSyncObserver):
    """Keeps the last ages the job measured."""

    ages: dict[tuple[str, int], float] = {}  # noqa: RUF012 - replaced, never mutated

    def lag_age_measured(self, ages: Mapping[tuple[str, int], float]) -> None:
        super().lag_age_measured(ages)
        self.ages = dict(ages)


def _produce_written_at(container: Container, topics: TalentTopics, written_at: datetime, count: int) -> None:
    """Tenant snapshots whose records Talent wrote at `written_at` (their record timestamps)."""
    producer = Producer(dict(container.connections.kafka_client_config))
    for _ in range(count):
        snapshot = talent.tenant()
        producer.produce(
            topics.tenants,
            key=snapshot["tenantId"],
            value=json.dumps(snapshot),
            partition=0,
            timestamp=int(written_at.timestamp() * 1000),
        )
    assert producer.flush(30) == 0


def test_talent_sync_publishes_the_age_of_its_oldest_unapplied_record_and_its_slo_alert_fires(
    container: Container, talent_topics: TalentTopics, tmp_path: Path
) -> None:
    written_at = datetime.now(UTC) - timedelta(minutes=10)
    _produce_written_at(container, talent_topics, written_at, 5)
    observer = _Ages()
    # One record a batch, the lag reported after each: records wait behind the one applied.
    settings = TalentSyncSettings(batch_size=1, poll_timeout_s=0.3)
    stream = talent.talent_stream(container, talent_topics)
    replica = container.stores.replica_transactions
    job = TalentSyncJob(stream, replica, settings, clock=SYSTEM_CLOCK, observer=observer)

    def measured() -> bool:
        job.step()
        job.report_lag()
        return any(age > 0 for age in observer.ages.values())

    try:
        wait_until(measured, "talent-sync measured how old its oldest unapplied record is", timeout_s=60)
    finally:
        stream.close()

    [(where, age)] = [(where, age) for where, age in observer.ages.items() if age > 0]
    assert where == (talent_topics.tenants, 0)
    assert 600 <= age < 660, age  # the record's timestamp, ten minutes ago, not when it was read
    labels = {"topic": talent_topics.tenants, "partition": "0"}
    assert REGISTRY.get_sample_value("talent_sync_consumer_lag_seconds", labels) == age

    # What Prometheus would scrape from here on, the consumer stuck: the SLO's alert fires.
    series = f'talent_sync_consumer_lag_seconds{{namespace="prod",job="talent-sync",instance="w1:9464",topic="{talent_topics.tenants}",partition="0"}}'  # noqa: E501
    verdict = firing_after("TalentSyncLagOverSLO", {series: f"{int(age)}+60x10"}, "5m", tmp_path)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr


def test_the_outbox_age_of_a_stuck_relay_makes_its_alert_fire(container: Container, tmp_path: Path) -> None:
    """No relay publishes: the oldest event's age, as serve reads it for /metrics, grows past the alert's 5
    minutes and OutboxOldestEventTooOld fires on it."""
    ctx = Context(uuid.uuid4(), datetime.now(UTC))
    identity_changes.create_company(
        container.stores.identity_transactions, ctx, name="Stroy Invest", company_type=CompanyType.DEVELOPER
    )
    with container.connections.database.connection() as conn:
        # Written six minutes ago, and the relay never came.
        conn.execute("UPDATE identity.outbox_events SET created_at = now() - interval '6 minutes'")

    gauges = DatabaseGauges.of(container)
    try:
        read = gauges.read()
    finally:
        gauges.close()

    assert 360 <= read.outbox_oldest_age_s < 420
    assert REGISTRY.get_sample_value("identity_outbox_oldest_age_seconds") == read.outbox_oldest_age_s
    series = 'identity_outbox_oldest_age_seconds{namespace="prod",job="serve",instance="s1:8080"}'
    verdict = firing_after(
        "OutboxOldestEventTooOld", {series: f"{int(read.outbox_oldest_age_s)}+60x10"}, "6m", tmp_path
    )
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr

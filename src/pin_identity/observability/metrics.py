"""Prometheus metrics of the jobs (names from the specs and CONTRACTS section 4a).

The specs fix two duration histograms in milliseconds (`..._duration_ms`), which `promtool check metrics`
flags as abbreviated units. They stay as the specs name them; each has a base-unit twin
(`..._duration_seconds`) observed at the same place, and the dashboard and alerts in deploy/ read the twins.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

registry: CollectorRegistry = REGISTRY

# ---- transactional outbox
outbox_published_total = Counter(
    "identity_outbox_published_total", "Outbox events acknowledged by the broker", ["topic"]
)
outbox_dead_letters_total = Counter(
    "identity_outbox_dead_letters_total", "Outbox events the broker rejected for good (moved to dead letters)"
)
outbox_publish_errors_total = Counter(
    "identity_outbox_publish_errors_total", "Outbox publish attempts that will be retried", ["reason"]
)
outbox_backlog = Gauge("identity_outbox_backlog", "Outbox events not yet acknowledged by the broker")
outbox_oldest_age_seconds = Gauge("identity_outbox_oldest_age_seconds", "Age of the oldest unpublished event")
outbox_publishing_held_seconds = Gauge(
    "identity_outbox_publishing_held_seconds",
    "How long the oldest running transaction that took an outbox id has run (nothing after it is published)",
)
outbox_topic_missing = Gauge(
    "identity_outbox_topic_missing",
    "1 while the relay holds a topic's events because the broker does not have the topic",
    ["topic"],
)
outbox_unacknowledged_seconds = Gauge(
    "identity_outbox_unacknowledged_seconds",
    "How long the relay has waited for the broker to acknowledge its events (0 while none wait)",
)
outbox_id_resets_total = Counter(
    "identity_outbox_id_resets_total", "Times the outbox id sequence was found below what the relay had read"
)

# ---- access fan-out (spec: Наблюдаемость; plus CONTRACTS 4a)
fanout_task_duration_ms = Histogram(
    "identity_access_fanout_task_duration_ms",
    "Time from StartedAt (the first claim) to completion of a fan-out task",
    buckets=(50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000),
)
fanout_task_duration_seconds = Histogram(
    "identity_access_fanout_task_duration_seconds",
    "Time from StartedAt (the first claim) to completion of a fan-out task (twin of ..._duration_ms)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
fanout_users_total = Counter(
    "identity_access_fanout_users_total", "Users sent a UserAccessChanged by the fan-out"
)
fanout_queue_backlog = Gauge(
    "identity_access_fanout_queue_backlog",
    "Fan-out tasks no worker is on: Pending, InProgress with an expired lease, or waiting out a back-off",
)
fanout_errors_total = Counter(
    "identity_access_fanout_errors_total", "Fan-out batches that failed and rolled back"
)
fanout_task_lag_seconds = Histogram(
    "identity_access_fanout_task_lag_seconds",
    "now - CreatedAt when a task completes (the SLO: <= 300 s for roles of <= 50k users)",
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
)
fanout_size = Histogram(
    "identity_access_fanout_size",
    "Users told per role permission change: a completed fan-out task, or an inline announcement",
    buckets=(0, 100, 200, 500, 1000, 5000, 10_000, 50_000, 100_000, 500_000, 1_000_000, 5_000_000),
)
fanout_tasks_total = Counter("identity_access_fanout_tasks_total", "Fan-out tasks finished", ["result"])
fanout_batches_total = Counter("identity_access_fanout_batches_total", "Fan-out batches committed")
fanout_relay_wait_seconds_total = Counter(
    "identity_access_fanout_relay_wait_seconds_total",
    "Seconds fan-out pages waited for the outbox's backlog to fall below its limit (the relay behind)",
)
fanout_failed_tasks = Gauge("identity_access_fanout_failed_tasks", "Fan-out tasks in status Failed (poison)")
fanout_last_success = Gauge(
    "identity_access_fanout_last_success_timestamp_seconds", "When a fan-out task last completed"
)

# ---- Talent replica: the continuous consumer (issue-named) and the initial import (spec: Наблюдаемость)
talent_sync_items_total = Counter(
    "talent_sync_items_total", "Talent snapshots applied by the continuous consumer", ["aggregate", "result"]
)
talent_sync_stale_events_total = Counter(
    "talent_sync_stale_events_total",
    "Talent snapshots skipped by the version guard (INV-6/INV-10)",
    ["aggregate"],
)
talent_sync_conflicts_total = Counter(
    "talent_sync_conflicts_total", "Talent users quarantined because their phone belongs to another user (R6)"
)
talent_sync_offset_commit_failures_total = Counter(
    "talent_sync_offset_commit_failures_total",
    "Applied batches whose offsets the group's coordinator did not take (read again after a restart)",
)
talent_sync_stalled_seconds = Gauge(
    "talent_sync_stalled_seconds",
    "How long the continuous consumer has read nothing of a partition that has records left to read",
)
talent_sync_consumer_lag = Gauge(
    "talent_sync_consumer_lag",
    "Records the continuous consumer is behind, per partition",
    ["topic", "partition"],
)
talent_sync_consumer_lag_seconds = Gauge(
    "talent_sync_consumer_lag_seconds",
    "Age of the oldest Talent record the continuous consumer has not applied yet, per partition: now less "
    "its record timestamp (0 when caught up)",
    ["topic", "partition"],
)
import_running = Gauge("identity_import_running", "1 while this process works on a Running import run")
import_pages_total = Counter("identity_import_pages_total", "Import pages finished", ["stage", "status"])
import_items_total = Counter(
    "identity_import_items_total", "Import items by outcome", ["aggregate", "result"]
)
import_page_duration_ms = Histogram(
    "identity_import_page_duration_ms",
    "Time to read and apply one import page",
    buckets=(10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000),
)
import_page_duration_seconds = Histogram(
    "identity_import_page_duration_seconds",
    "Time to read and apply one import page (base-unit twin of ..._duration_ms)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
import_failed_items_total = Counter("identity_import_failed_items_total", "Import items quarantined")
import_run_items_planned = Gauge(
    "identity_import_run_items_planned",
    "Items the Running import run's source listed so far, by aggregate (0 while no run is Running)",
    ["aggregate"],
)
import_run_items_finished = Gauge(
    "identity_import_run_items_finished",
    "Items of the Running import run applied, skipped or quarantined so far, by aggregate",
    ["aggregate"],
)
import_run_started = Gauge(
    "identity_import_run_started_timestamp_seconds", "When the import run this process works on started"
)

# ---- the platform-admin API (`serve`)
admin_tokens_file_load_error = Gauge(
    "identity_admin_tokens_file_load_error",
    "1 while PIN_IDENTITY_ADMIN_TOKENS_FILE cannot be read or parsed (of its operators only those whose line "
    "is unchanged stay in force; none when it cannot be read), else 0",
)


def record_outbox_backlog(waiting: int, oldest_age_s: float, held_s: float) -> None:
    """The outbox's gauges, as the relay sees them every few seconds and `serve` for scrapes (at most
    every 5 s)."""
    outbox_backlog.set(waiting)
    outbox_oldest_age_seconds.set(oldest_age_s)
    outbox_publishing_held_seconds.set(held_s)


def record_import_running(started_at: datetime | None) -> None:
    """Whether an import run is Running and since when, from its orchestrator or from `serve`'s scrape: the
    import alerts read either process."""
    import_running.set(1 if started_at is not None else 0)
    if started_at is not None:
        import_run_started.set(started_at.timestamp())


IMPORT_AGGREGATES = ("company", "user")


def record_import_progress(planned: Mapping[str, int], finished: Mapping[str, int]) -> None:
    """The Running run's items by aggregate (`company`, `user`), as `serve` reads its row for scrapes: the
    dashboard's progress against the planned total. An aggregate not given (no run) reads 0."""
    for aggregate in IMPORT_AGGREGATES:
        import_run_items_planned.labels(aggregate=aggregate).set(planned.get(aggregate, 0))
        import_run_items_finished.labels(aggregate=aggregate).set(finished.get(aggregate, 0))


def record_fanout_queue(backlog: int, failed: int) -> None:
    """The fan-out queue's gauges, as the worker sees them at each claim and `serve` for scrapes (at most
    every 5 s)."""
    fanout_queue_backlog.set(backlog)
    fanout_failed_tasks.set(failed)


def observe_fanout_task_duration(seconds: float) -> None:
    """A completed fan-out task, in the spec's milliseconds and in seconds."""
    fanout_task_duration_ms.observe(seconds * 1000)
    fanout_task_duration_seconds.observe(seconds)


def observe_import_page_duration(seconds: float) -> None:
    """An applied import page, in the spec's milliseconds and in seconds."""
    import_page_duration_ms.observe(seconds * 1000)
    import_page_duration_seconds.observe(seconds)

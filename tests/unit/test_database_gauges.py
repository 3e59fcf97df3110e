"""The gauges `serve` reads from the database (admin_http.gauges): read at most once per few seconds whatever
the number of scrapes, a scrape never waiting for another's read, and a read that failed not tried again by
every scrape."""

from __future__ import annotations

import threading
from dataclasses import replace

import psycopg
import pytest

from pin_identity.domain.import_run import StageCounters
from pin_identity.entrypoints.admin_http.gauges import DatabaseGauges
from pin_identity.entrypoints.admin_http.problems import DatabaseUnavailableError
from pin_identity.observability import metrics
from pin_identity.operations.health_reads import QueueGauges
from tests.support.clocks import ManualClock


def figures(backlog: int) -> QueueGauges:
    return QueueGauges(
        outbox_backlog=backlog,
        outbox_oldest_age_s=1.0,
        outbox_held_s=0.0,
        outbox_held_by=None,
        fanout_backlog=backlog,
        fanout_failed=0,
        import_started_at=None,
    )


class Database:
    """The reads behind the gauges: counted, answering the count so far, or refusing while `down`."""

    def __init__(self) -> None:
        self.reads, self.down = 0, False

    def __call__(self) -> QueueGauges:
        self.reads += 1
        if self.down:
            raise psycopg.OperationalError("connection refused")
        return figures(self.reads)


def outbox_backlog() -> float | None:
    return metrics.registry.get_sample_value("identity_outbox_backlog")


def test_the_database_is_read_at_most_once_per_max_age_whatever_the_scrapes() -> None:
    database, clock = Database(), ManualClock()
    gauges = DatabaseGauges(database, max_age_s=5.0, clock=clock)
    for _ in range(1000):
        gauges.refresh()
    assert database.reads == 1 and outbox_backlog() == 1
    clock.advance(4.9)
    for _ in range(1000):
        gauges.refresh()
    assert gauges.read() == figures(1) and database.reads == 1
    clock.advance(0.1)
    gauges.refresh()
    assert database.reads == 2 and outbox_backlog() == 2
    assert gauges.read() == figures(2)


def test_a_read_that_failed_is_not_tried_again_by_every_scrape() -> None:
    database, clock = Database(), ManualClock()
    gauges = DatabaseGauges(database, max_age_s=5.0, clock=clock)
    gauges.refresh()
    database.down = True
    clock.advance(5)
    for _ in range(1000):
        gauges.refresh()  # the registry keeps the last figures; the log says why
    assert database.reads == 2 and outbox_backlog() == 1
    with pytest.raises(DatabaseUnavailableError):  # the console's summary: stale figures are not the present
        gauges.read()
    database.down = False
    clock.advance(5)
    assert gauges.read() == figures(3)


def test_a_scrape_does_not_wait_for_another_scrapes_read() -> None:
    """While one read waits on the database, other scrapes answer with the registry's last figures."""
    entered, release = threading.Event(), threading.Event()
    clock = ManualClock()

    def slow_database() -> QueueGauges:
        entered.set()
        release.wait(timeout=30)
        return figures(7)

    gauges = DatabaseGauges(slow_database, max_age_s=5.0, clock=clock)
    reading = threading.Thread(target=gauges.refresh)
    reading.start()
    try:
        assert entered.wait(timeout=30)
        finished = threading.Event()
        other = threading.Thread(target=lambda: (gauges.refresh(), finished.set()))
        other.start()
        assert finished.wait(timeout=30)  # answered while the first read still waits
        other.join()
    finally:
        release.set()
        reading.join(timeout=30)
    assert outbox_backlog() == 7


def test_the_running_runs_items_planned_and_finished_are_gauges_by_aggregate() -> None:
    """The dashboard's progress of a bootstrap against its planned total, from the run's counters."""
    running = replace(
        figures(1),
        import_counters={"company": StageCounters(10, 6, 1, 1), "user": StageCounters(40, 5, 0, 0)},
    )
    DatabaseGauges(lambda: running, clock=ManualClock()).refresh()
    sample = metrics.registry.get_sample_value
    assert sample("identity_import_run_items_planned", {"aggregate": "company"}) == 10
    assert sample("identity_import_run_items_finished", {"aggregate": "company"}) == 8
    assert sample("identity_import_run_items_planned", {"aggregate": "user"}) == 40
    assert sample("identity_import_run_items_finished", {"aggregate": "user"}) == 5
    DatabaseGauges(lambda: figures(1), clock=ManualClock()).refresh()  # no run is Running any more
    assert sample("identity_import_run_items_planned", {"aggregate": "user"}) == 0
    assert sample("identity_import_run_items_finished", {"aggregate": "user"}) == 0

"""Runs the real fan-out job in-process, with a clock the test moves and no LISTEN connection."""

from __future__ import annotations

import threading
import time

import psycopg

from pin_identity.composition import Container
from pin_identity.config import FanOutSettings
from pin_identity.jobs.access_fanout import AccessFanOutJob
from pin_identity.operations.ports.fanout_tasks import FanOutQueue
from tests.support.clocks import ManualClock


class NoWakeups:
    def wait(self, timeout_s: float) -> bool:
        time.sleep(timeout_s)
        return False

    def close(self) -> None:
        return None


def fanout_job(
    container: Container,
    clock: ManualClock,
    *,
    batch_size: int = 50,
    max_attempts: int = 5,
    queue: FanOutQueue | None = None,
) -> AccessFanOutJob:
    # No pace: a page held back by the outbox waits on the job's clock, which only the test moves (the pace
    # is the unit tests').
    settings = FanOutSettings(
        polling_interval_s=0.01,
        batch_size=batch_size,
        max_lease_s=300,
        max_attempts=max_attempts,
        outbox_backlog_limit=0,
    )
    return AccessFanOutJob(queue or container.stores.fanout_queue, NoWakeups(), settings, clock)


def run_until_idle(job: AccessFanOutJob) -> None:
    job.run(threading.Event(), once=True)


def task_progress(database_url: str) -> tuple[str, int]:
    """The one fan-out task's status and processed count."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT status, processed_count FROM identity.access_fanout_tasks").fetchone()
    assert row is not None
    return row[0], row[1]

"""The lease rules (pin_identity.domain.lease) held by both queues that lease rows, fan-out tasks and import
pages: each scenario runs once per queue, against PostgreSQL, at times passed in (never the server's clock):
a claim holds its row until its lease runs out, a later claim takes it over and fences the stale owner out, a
released row waits out its back-off, a row whose attempts are spent fails instead of being claimed, and a
claim whose holder's session ended is taken over at once.

Where the queues differ as stored, the tests say so: a fan-out task's committed batch renews the lease (a
write under it here), an import page's fenced transaction does; a counted release on the last attempt fails an
import page at once and a fan-out task once its back-off is over."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol

import psycopg
import pytest

from pin_identity.adapters.postgres.holder_session import HOLDER_LOCK_SPACE
from pin_identity.composition import Container
from pin_identity.composition.stores import Stores
from pin_identity.config import FanOutSettings, Settings
from pin_identity.domain.errors import LeaseLostError
from pin_identity.domain.import_run import ImportPage
from pin_identity.domain.lease import Release
from pin_identity.operations.ports.fanout_tasks import FanOutTask
from tests.support.waiting import wait_until

# Far from the server's clock, on purpose: every statement takes the time it is given.
NOW = datetime(2031, 5, 1, 9, 0, tzinfo=UTC)
RULES = FanOutSettings(max_lease_s=60, max_attempts=3).lease_rules
TICK = timedelta(microseconds=1)

Leased = FanOutTask | ImportPage


class LeasedQueue(Protocol):
    """What the scenarios do with a queue, in its own port's words."""

    table: str

    def claim(self, now: datetime) -> Leased | None: ...
    def write(self, leased: Leased, now: datetime) -> None:
        """A write under the lease (it renews it); raises LeaseLostError when the row is no longer ours."""
        ...

    def release(self, leased: Leased, now: datetime, release: Release) -> None: ...
    def fail_exhausted(self, now: datetime) -> int: ...


class FanOutTasks:
    table = "identity.access_fanout_tasks"

    def __init__(self, stores: Stores):
        self._queue = stores.fanout_queue

    @staticmethod
    def add(conn: psycopg.Connection) -> None:
        role_id = uuid.uuid4()
        conn.execute(
            "INSERT INTO identity.role_definitions (id, code, name) VALUES (%s, 'r', 'R')", (role_id,)
        )
        conn.execute(
            "INSERT INTO identity.access_fanout_tasks (id, role_id, role_version) VALUES (%s, %s, 1)",
            (uuid.uuid4(), role_id),
        )

    def claim(self, now: datetime) -> FanOutTask | None:
        return self._queue.claim(uuid.uuid4(), now, RULES.until(now))

    def write(self, leased: Leased, now: datetime) -> None:
        assert isinstance(leased, FanOutTask)
        with self._queue.batch(leased, now, RULES.until(now)) as batch:
            batch.advance(cursor=None, processed=0, completed=False)
            batch.commit()

    def release(self, leased: Leased, now: datetime, release: Release) -> None:
        assert isinstance(leased, FanOutTask)
        self._queue.release(leased, now, release)

    def fail_exhausted(self, now: datetime) -> int:
        return len(self._queue.fail_exhausted(now, RULES.max_attempts))


class ImportPages:
    table = "identity.talent_import_pages"

    def __init__(self, stores: Stores):
        self._store = stores.import_store

    @staticmethod
    def add(conn: psycopg.Connection) -> None:
        run_id = uuid.uuid4()
        conn.execute(
            "INSERT INTO identity.talent_import_runs (id, mode, correlation_id) VALUES (%s, 'ApiPull', %s)",
            (run_id, uuid.uuid4()),
        )
        conn.execute(
            """INSERT INTO identity.talent_import_pages (id, run_id, stage, page_no)
               VALUES (%s, %s, 'Tenants', 0)""",
            (uuid.uuid4(), run_id),
        )

    def claim(self, now: datetime) -> ImportPage | None:
        return self._store.claim(uuid.uuid4(), now, RULES.until(now), None)

    def write(self, leased: Leased, now: datetime) -> None:
        assert isinstance(leased, ImportPage)
        with self._store.page_transaction(leased, now, RULES.until(now)) as tx:
            tx.commit()

    def release(self, leased: Leased, now: datetime, release: Release) -> None:
        assert isinstance(leased, ImportPage)
        self._store.release(leased, now, release, RULES.max_attempts)

    def fail_exhausted(self, now: datetime) -> int:
        return self._store.fail_exhausted(now, RULES.max_attempts)


QUEUES = {"fanout-task": FanOutTasks, "import-page": ImportPages}


@pytest.fixture(params=sorted(QUEUES))
def kind(request: pytest.FixtureRequest, database_url: str) -> type[FanOutTasks | ImportPages]:
    """One queue, holding one row no one has claimed yet."""
    queue: type[FanOutTasks | ImportPages] = QUEUES[request.param]
    with psycopg.connect(database_url) as conn:
        queue.add(conn)
    return queue


@pytest.fixture
def queue(kind: type[FanOutTasks | ImportPages], stores: Stores) -> LeasedQueue:
    return kind(stores)


def _status(database_url: str, queue: LeasedQueue) -> tuple[str, int]:
    with psycopg.connect(database_url) as conn:
        [row] = conn.execute(f"SELECT status, attempt_count FROM {queue.table}").fetchall()
    return row[0], row[1]


def _claimed(queue: LeasedQueue, now: datetime) -> Leased:
    leased = queue.claim(now)
    assert leased is not None
    return leased


def test_a_claim_holds_its_row_until_its_lease_runs_out_then_a_later_claim_fences_it_out(
    queue: LeasedQueue, database_url: str
) -> None:
    first = _claimed(queue, NOW)
    assert first.attempt == 1 and _status(database_url, queue) == ("InProgress", 1)
    assert queue.claim(RULES.until(NOW) - TICK) is None  # a live lease is refused

    queue.write(first, NOW + timedelta(seconds=10))  # still mine: the lease is renewed from then
    assert queue.claim(RULES.until(NOW)) is None
    later = RULES.until(NOW + timedelta(seconds=10))
    second = _claimed(queue, later)  # run out at a later `now`: claimable

    assert (second.attempt, second.claim_id != first.claim_id) == (2, True)
    with pytest.raises(LeaseLostError):
        queue.write(first, later)  # the stale owner
    queue.write(second, later)


def test_a_lease_run_out_that_no_claim_took_over_is_still_its_owners(queue: LeasedQueue) -> None:
    first = _claimed(queue, NOW)
    queue.write(first, RULES.until(NOW) + timedelta(hours=1))
    assert queue.claim(RULES.until(NOW) + timedelta(hours=1)) is None  # renewed by the write


def test_a_failed_attempt_released_waits_out_its_back_off(queue: LeasedQueue, database_url: str) -> None:
    first = _claimed(queue, NOW)
    release = RULES.release(NOW, first.attempt, count_attempt=True, error="the database went away")
    queue.release(first, NOW, release)

    assert release.available_at == NOW + timedelta(seconds=2)
    assert queue.claim(release.available_at - TICK) is None
    again = _claimed(queue, release.available_at)
    assert again.attempt == 2
    with pytest.raises(LeaseLostError):
        queue.write(first, release.available_at)


def test_a_release_that_does_not_count_gives_the_attempt_back_and_the_row_at_once(queue: LeasedQueue) -> None:
    first = _claimed(queue, NOW)
    queue.release(first, NOW, RULES.release(NOW, first.attempt, count_attempt=False, error=None))

    assert _claimed(queue, NOW).attempt == 1


def test_a_row_whose_leases_ran_out_max_attempts_times_fails_instead_of_being_claimed(
    queue: LeasedQueue, database_url: str
) -> None:
    now = NOW
    for _ in range(RULES.max_attempts):
        _claimed(queue, now)
        assert queue.fail_exhausted(now) == 0  # held: not failed
        now = RULES.until(now)  # its holder never comes back

    assert queue.fail_exhausted(now - TICK) == 0
    assert queue.fail_exhausted(now) == 1
    assert queue.claim(now) is None
    assert _status(database_url, queue) == ("Failed", RULES.max_attempts)


def test_a_failed_last_attempt_released_fails_the_row(queue: LeasedQueue, database_url: str) -> None:
    now = NOW
    for _ in range(RULES.max_attempts - 1):
        _claimed(queue, now)
        now = RULES.until(now)
    last = _claimed(queue, now)
    release = RULES.release(now, last.attempt, count_attempt=True, error="the source refused the page")
    queue.release(last, now, release)

    # An import page fails at its release, a fan-out task once its back-off is over (it waits InProgress).
    queue.fail_exhausted(release.available_at)
    assert queue.claim(release.available_at) is None
    assert _status(database_url, queue) == ("Failed", RULES.max_attempts)


# ---------------------------------------------------------------- the claim's holder (migration 0009)


_HOLDER_LOCK = """FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND classid = %s::bigint::oid
                   AND objid = %s::bigint::oid"""


def _end_holder_session(database_url: str, key: int) -> None:
    """The holder's session ends under it (a network blip, a failover of the path): its lock goes with it,
    once its backend has exited."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        lock = (HOLDER_LOCK_SPACE, key)
        [(ended,)] = conn.execute(f"SELECT count(pg_terminate_backend(pid)) {_HOLDER_LOCK}", lock).fetchall()
        assert ended == 1
        wait_until(lambda: not conn.execute(f"SELECT 1 {_HOLDER_LOCK}", lock).fetchall(), "the lock is gone")


@pytest.fixture
def second_worker(settings: Settings) -> Iterator[Container]:
    """Another worker process's stores: its own pool, its own holder session."""
    other = Container(settings)
    yield other
    other.close()


def test_a_holder_whose_session_ended_is_taken_over_at_once_and_fenced(
    kind: type[FanOutTasks | ImportPages],
    container: Container,
    second_worker: Container,
    database_url: str,
) -> None:
    ours, theirs = kind(container.stores), kind(second_worker.stores)
    first = _claimed(ours, NOW)
    assert theirs.claim(NOW) is None  # a live holder keeps its lease

    _end_holder_session(database_url, container.connections.database.holder_key())
    taken = _claimed(theirs, NOW)  # long before the lease runs out

    assert taken.claim_id != first.claim_id
    with pytest.raises(LeaseLostError):
        ours.write(first, NOW)
    assert ours.claim(NOW) is None  # a new session, a live claim

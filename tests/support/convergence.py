"""Convergence checks (CONTRACTS section 4): the last access event of each user against the database."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from uuid import UUID

import psycopg

from tests.support.kafka_tap import ConsumedEvent, EventTap


def last_access_events(events: Iterable[ConsumedEvent]) -> dict[str, list[str]]:
    """Each user's last UserAccessChanged (topic order per key): the assignment ids it carries."""
    last: dict[str, list[str]] = {}
    for event in events:
        if event.body.get("eventType") == "UserAccessChanged":
            last[event.key] = sorted(a["assignmentId"] for a in event.payload["activeAssignments"])
    return last


def active_assignments(database_url: str, user_ids: Iterable[UUID]) -> dict[str, list[str]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT user_id::text, array_agg(id::text ORDER BY id) FROM identity.role_assignments"
            " WHERE status = 'Active' AND user_id = ANY(%s) GROUP BY user_id",
            (list(user_ids),),
        ).fetchall()
    return {user: sorted(ids) for user, ids in rows}


def assert_converged(tap: EventTap, database_url: str, user_ids: Iterable[UUID]) -> None:
    """Once the outbox is drained, every user's last event carries exactly their Active assignments."""
    users = {str(user) for user in user_ids}
    last = last_access_events(tap.read_to_end(lambda e: e.key in users))
    truth = active_assignments(database_url, [UUID(user) for user in users])
    drifted = {
        user: (last.get(user), truth.get(user, [])) for user in users if last.get(user) != truth.get(user, [])
    }
    assert drifted == {}, f"last event != database for {len(drifted)} users: {drifted}"


class CommitHold:
    """Holds every transaction that revokes a role assignment at its commit, until released.

    A deferred constraint trigger (test-only, in the test's own database) takes an advisory lock that this
    session holds: the revoke has done all its work, holds its row locks and has written its outbox row,
    and waits at COMMIT, the widest window a slow commit (a synchronous standby, an fsync stall) opens.
    """

    KEY = 7_345_001

    def __init__(self, database_url: str):
        self._conn = psycopg.connect(database_url, autocommit=True)
        self._conn.execute(
            f"""
            CREATE FUNCTION public.hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_advisory_xact_lock({self.KEY}); RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER hold_revoke_commit AFTER UPDATE ON identity.role_assignments
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.status = 'Revoked')
            EXECUTE FUNCTION public.hold_commit();
            """
        )
        self._conn.execute("SELECT pg_advisory_lock(%s)", (self.KEY,))

    def waiting(self) -> int:
        """Sessions of this database waiting for a lock (the held commit, and whoever waits for it)."""
        row = self._conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        ).fetchone()
        return int(row[0]) if row else 0

    def release(self) -> None:
        self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.KEY,))
        self._conn.execute("DROP TRIGGER hold_revoke_commit ON identity.role_assignments")
        self._conn.close()


class Background:
    """A call running in a thread; join() re-raises what it raised."""

    def __init__(self, target: Callable[[], object]):
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self._thread.start()

    def _run(self, target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # re-raised in the test's thread by join()
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout_s: float = 30.0) -> None:
        self._thread.join(timeout_s)
        assert self.done, "the call did not finish in time"
        if self._error is not None:
            raise self._error

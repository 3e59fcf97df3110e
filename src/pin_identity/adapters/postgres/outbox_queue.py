"""The relay's side of the outbox: one dedicated session that holds the relay lock and moves rows out."""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Mapping, Sequence

import psycopg

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database
from pin_identity.jobs.ports import PendingEvent, RelayRole


class PostgresOutboxQueue:
    """The advisory lock lives with the session: when the session dies, a standby relay takes over.

    `identity.outbox_relay_handover` says whether the last active relay stood down cleanly (its producer
    discarded before the lock went); a relay taking over from one that did not waits a grace period.
    """

    def __init__(self, database: Database):
        self._database = database
        self._conn: psycopg.Connection | None = None
        self._active = False
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"

    def _session(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self._database.dedicated(autocommit=True, name="pin-identity-outbox-relay")
            # Removing published rows need not wait for the WAL flush: a removal lost in a crash only
            # sends those events once more, which at-least-once delivery allows. (And custom plans: see the
            # statement's comment.)
            self._conn.execute(query("relay_session_settings"))
            self._active = False
        return self._conn

    def try_become_active(self) -> RelayRole:
        conn = self._session()
        if self._active:
            return RelayRole.ACTIVE
        row = conn.execute(query("try_lock_outbox_relay")).fetchone()
        if not (row and row[0]):
            return RelayRole.STANDBY
        self._active = True
        previous = conn.execute(query("take_outbox_relay_handover"), {"holder": self._holder}).fetchone()
        return RelayRole.ACTIVE if previous and previous[0] else RelayRole.TAKEN_OVER

    def fetch_ready(self, limit: int, in_flight: Collection[int]) -> list[PendingEvent]:
        # Binary transfer: the batch is megabytes of event values, and text parsing is the slow part.
        with self._session().cursor(binary=True) as cursor:
            params = {"limit": limit, "in_flight": list(in_flight)}
            cursor.execute(query("fetch_ready_outbox_events"), params)
            return [PendingEvent(*row) for row in cursor]

    def settle(self, delivered: Sequence[int], rejected: Mapping[int, str]) -> None:
        conn = self._session()
        with conn.transaction():
            if delivered:
                conn.execute(query("delete_outbox_events"), {"ids": list(delivered)})
            for outbox_id, error in rejected.items():
                conn.execute(query("dead_letter_outbox_event"), {"id": outbox_id, "error": error[:2000]})

    def backlog(self) -> tuple[int, float]:
        row = self._session().execute(query("outbox_backlog")).fetchone()
        return (int(row[0]), float(row[1])) if row else (0, 0.0)

    def is_drained(self) -> bool:
        row = self._session().execute(query("outbox_is_empty")).fetchone()
        return bool(row and row[0])

    def heartbeat(self) -> None:
        self._session().execute(query("ping"))

    def stand_down(self) -> None:
        if self._conn is None:
            return
        try:
            if self._active and not self._conn.closed:
                self._conn.execute(query("stand_down_outbox_relay"), {"holder": self._holder})
        except psycopg.Error:
            pass  # the session is gone, and the lock with it: the next relay waits its grace period
        finally:
            self.reset()

    def reset(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
                self._active = False

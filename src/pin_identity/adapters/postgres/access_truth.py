"""The database's side of the access audit: pending access events and each user's Active assignments."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database
from pin_identity.domain.access_audit import Fingerprint, UserKey, fingerprint
from pin_identity.domain.events import ACCESS_TOPIC

_CHUNK = 5000


class PostgresTruthSnapshot:
    def __init__(self, conn: psycopg.Connection):
        self._conn = conn

    def pending(self) -> frozenset[UserKey]:
        rows = self._conn.execute(query("pending_access_users"), {"topic": ACCESS_TOPIC})
        return frozenset(row[0].bytes for row in rows)

    def truths(self) -> Iterator[tuple[UserKey, Fingerprint]]:
        # A server-side cursor: a million users stream through in chunks, each rendered as the fan-out
        # renders its pages (so the audit compares events with exactly what the fan-out would write).
        with self._conn.cursor(name="pin_identity_access_audit") as users:
            users.execute(query("users_with_active_assignments"))
            while chunk := users.fetchmany(_CHUNK):
                rows = self._conn.execute(
                    query("rendered_access_snapshots"), {"user_ids": [r[0] for r in chunk]}
                )
                for user_id, _company_id, rendered in rows:
                    yield user_id.bytes, fingerprint(json.loads(rendered))


class PostgresAccessTruth:
    def __init__(self, database: Database):
        self._database = database

    @contextmanager
    def snapshot(self) -> Iterator[PostgresTruthSnapshot]:
        with self._database.connection() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with conn.transaction():
                    yield PostgresTruthSnapshot(conn)
            finally:
                conn.isolation_level = None

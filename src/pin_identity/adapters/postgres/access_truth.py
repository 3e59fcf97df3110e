"""The database's side of the access audit (where the topic's records are kept, pending access events and
each user's Active assignments) and of `access show` (one user's assignments and queued access events)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database
from pin_identity.domain.access_audit import Fingerprint, LastEvent, UserKey, fingerprint
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.operations.read_models import QueuedAccessEvent, UserAccessState

_CHUNK = 5000
_COPY_NULL = "\\N"


class PostgresTruthSnapshot:
    def __init__(self, conn: psycopg.Connection):
        self._conn = conn

    def pending(self) -> frozenset[UserKey]:
        rows = self._conn.execute(query("pending_access_users"), {"topic": ACCESS_TOPIC})
        return frozenset(row[0].bytes for row in rows)

    def truths(self) -> Iterator[tuple[UserKey, Fingerprint]]:
        # A server-side cursor: a million users stream through in chunks, each rendered as the fan-out
        # renders its pages (so the audit compares events with exactly what the fan-out would write).
        with self._conn.cursor(name="pin_identity_audit_truths") as users:
            users.execute(query("users_with_active_assignments"))
            while chunk := users.fetchmany(_CHUNK):
                rows = self._conn.execute(
                    query("rendered_access_snapshots"), {"user_ids": [r[0] for r in chunk]}
                )
                for user_id, _company_id, rendered in rows:
                    yield user_id.bytes, fingerprint(json.loads(rendered))

    def last_events(self) -> Iterator[LastEvent]:
        with self._conn.cursor(name="pin_identity_audit_last_events") as events:
            events.execute(query("audit_last_events"))
            while chunk := events.fetchmany(_CHUNK):
                for user_id, last in chunk:
                    yield user_id.bytes, last


class PostgresAuditSession:
    """A session of its own: its temporary table of topic records goes with it."""

    def __init__(self, conn: psycopg.Connection):
        self._conn = conn
        self._seq = 0

    def keep(self, records: Sequence[LastEvent]) -> None:
        # One COPY per batch, each a short statement (statement_timeout applies to each).
        lines = []
        for user, last in records:
            self._seq += 1
            lines.append(f"{self._seq}\t{user.hex()}\t{_COPY_NULL if last is None else last}\n")
        with self._conn.cursor() as cur, cur.copy(query("copy_audit_topic_records")) as copy:
            copy.write("".join(lines))

    @contextmanager
    def snapshot(self) -> Iterator[PostgresTruthSnapshot]:
        self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            with self._conn.transaction():
                yield PostgresTruthSnapshot(self._conn)
        finally:
            self._conn.isolation_level = None


class PostgresAccessTruth:
    """AccessTruth (the audit) and UserAccessStates (`access show`)."""

    def __init__(self, database: Database):
        self._database = database

    @contextmanager
    def session(self) -> Iterator[PostgresAuditSession]:
        with self._database.dedicated(name="pin-identity access-audit") as conn:
            conn.execute(query("create_audit_topic_records"))
            yield PostgresAuditSession(conn)

    @contextmanager
    def _repeatable_read(self) -> Iterator[psycopg.Connection]:
        with self._database.connection() as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with conn.transaction():
                    yield conn
            finally:
                conn.isolation_level = None

    def user_exists(self, user_id: UUID) -> bool:
        [(exists,)] = self._database.execute("user_exists", {"user_id": user_id})
        return bool(exists)

    def user_state(self, user_id: UUID) -> UserAccessState | None:
        # One snapshot: an assignment change and its outbox row are seen together or not at all.
        with self._repeatable_read() as conn:
            rendered = conn.execute(query("rendered_access_snapshots"), {"user_ids": [user_id]}).fetchall()
            if not rendered:
                return None
            [(_, company_id, assignments)] = rendered
            params = {"topic": ACCESS_TOPIC, "key": str(user_id)}
            queued = conn.execute(query("queued_access_events_of_user"), params).fetchall()
        events = [(dead, _queued(row)) for dead, *row in queued]
        return UserAccessState(
            user_id=user_id,
            company_id=company_id,
            active_assignments=json.loads(assignments),
            waiting=tuple(event for dead, event in events if not dead),
            dead_letters=tuple(event for dead, event in events if dead),
        )


def _queued(row: list[Any]) -> QueuedAccessEvent:
    outbox_id, event_id, reason, version, queued_at, error = row
    return QueuedAccessEvent(
        outbox_id=outbox_id,
        event_id=event_id,
        change_reason=reason,
        version=int(version) if version is not None and version.isdigit() else None,
        queued_at=queued_at,
        error=error,
    )

"""The database's side of the access audit (where the topic's records are kept, pending access events and
each user's Active assignments) and of `access show` (one user's assignments and queued access events)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import orjson
import psycopg
from psycopg.rows import kwargs_row, scalar_row
from psycopg.types.array import ListBinaryDumper

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import NIL_UUID, Database, read
from pin_identity.domain.access_verdicts import Fingerprint, LastEvent, UserKey, fingerprint
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.domain.model import RenderedAccessSnapshot
from pin_identity.operations.ports.access_reads import QueuedAccessEventView, UserAccessState

_COPY_NULL = "\\N"


@dataclass(frozen=True)
class AuditChunks:
    """Rows a read of the audit's snapshot brings: users rendered a statement, and last events a statement,
    the fewer, the larger (each is answered after the truths' rendering queued before it)."""

    truths: int = 5000
    last_events: int = 50_000


class PostgresTruthSnapshot:
    def __init__(self, conn: psycopg.Connection, chunks: AuditChunks):
        self._conn = conn
        self._chunks = chunks

    def pending(self) -> frozenset[UserKey]:
        users = read(self._conn, "pending_access_users", {"topic": ACCESS_TOPIC}, scalar_row)
        return frozenset(user_id.bytes for user_id in users)

    def truths(self) -> Iterator[tuple[UserKey, Fingerprint]]:
        # A chunk of users at a time, each rendered as the fan-out renders its pages (so the audit compares
        # events with exactly what the fan-out would write). The snapshot is a pipeline: the next chunk's
        # rendering is queued before this one is fingerprinted, so the server works on it meanwhile (each was
        # about half of the truths' time, one after the other).
        users = self._users_after(NIL_UUID)
        rendering = None
        while True:
            chunk = users.fetchall()  # the server answers in order: the rendering before is done too
            done, rendering = rendering, self._render(chunk) if chunk else None
            if chunk:
                users = self._users_after(chunk[-1])
            if done is not None:
                yield from _fingerprinted(done)
            if rendering is None:
                return

    def _users_after(self, after: UUID) -> psycopg.Cursor[UUID]:
        cursor = self._conn.cursor(binary=True, row_factory=scalar_row)
        return cursor.execute(query("active_users_after"), {"after": after, "limit": self._chunks.truths})

    def _render(self, user_ids: list[UUID]) -> psycopg.Cursor[Any]:
        # Binary both ways: the ids go as a binary array, and uuids load from their 16 bytes (their text
        # form was a tenth of the audit's time, written and parsed).
        cursor = self._conn.cursor(binary=True)
        cursor.adapters.register_dumper(list, ListBinaryDumper)
        return cursor.execute(query("rendered_access_snapshots"), {"user_ids": user_ids})

    def last_events(self) -> Iterator[LastEvent]:
        # In the snapshot's pipeline, where a server-side cursor cannot be.
        after, size = NIL_UUID, self._chunks.last_events
        while True:
            cursor = self._conn.cursor(binary=True)
            chunk = cursor.execute(query("audit_last_events"), {"after": after, "limit": size}).fetchall()
            # By position, a million rows: (user id, fingerprint), which test_row_decoders holds.
            for user_id, last in chunk:
                yield user_id.bytes, last
            if len(chunk) < size:
                return
            after = chunk[-1][0]


def _fingerprinted(rendered: psycopg.Cursor[Any]) -> Iterator[tuple[UserKey, Fingerprint]]:
    # By position, a million rows: RenderedAccessSnapshot's order, which test_row_decoders holds.
    for user_id, _company_id, assignments in rendered:
        yield user_id.bytes, fingerprint(orjson.loads(assignments))


class PostgresAuditSession:
    """A session of its own: its temporary table of topic records goes with it."""

    def __init__(self, conn: psycopg.Connection, chunks: AuditChunks):
        self._conn = conn
        self._chunks = chunks
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
        self._conn.execute(query("index_audit_topic_records"))
        self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            with self._conn.transaction(), self._conn.pipeline():  # see truths()
                yield PostgresTruthSnapshot(self._conn, self._chunks)
        finally:
            self._conn.isolation_level = None


class PostgresAccessTruth:
    """AccessTruth (the audit) and UserAccessStates (`access show`)."""

    def __init__(self, database: Database, chunks: AuditChunks = AuditChunks()):
        self._database = database
        self._chunks = chunks

    @contextmanager
    def session(self) -> Iterator[PostgresAuditSession]:
        with self._database.dedicated(name="pin-identity access-audit") as conn:
            conn.execute(query("create_audit_topic_records"))
            yield PostgresAuditSession(conn, self._chunks)

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
        [exists] = self._database.fetch("user_exists", {"user_id": user_id}, scalar_row)
        return bool(exists)

    def user_state(self, user_id: UUID) -> UserAccessState | None:
        # One snapshot: an assignment change and its outbox row are seen together or not at all.
        with self._repeatable_read() as conn:
            rendered = conn.execute(query("rendered_access_snapshots"), {"user_ids": [user_id]}).fetchone()
            if rendered is None:
                return None
            snapshot = RenderedAccessSnapshot._make(rendered)
            params = {"topic": ACCESS_TOPIC, "key": str(user_id)}
            queued = read(conn, "queued_access_events_of_user", params, kwargs_row(_queued)).fetchall()
        return UserAccessState(
            user_id=user_id,
            company_id=snapshot.company_id,
            active_assignments=json.loads(snapshot.assignments_json),
            waiting=tuple(event for dead, event in queued if not dead),
            dead_letters=tuple(event for dead, event in queued if dead),
        )


def _queued(*, dead: bool, version: str | None, **columns: Any) -> tuple[bool, QueuedAccessEventView]:
    """A row of queued_access_events_of_user: whether it is a dead letter, and the event (its other columns
    are named as QueuedAccessEventView's fields)."""
    number = int(version) if version is not None and version.isdigit() else None
    return dead, QueuedAccessEventView(version=number, **columns)

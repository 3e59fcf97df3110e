"""ReplicaTransaction on PostgreSQL: the Talent replica read and written in batches (one statement each). One
class implements every port of operations/ports/replica.py (the reads, the rows, the default roles, the
events, the quarantine); each step of the apply sees only the one it takes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg import errors
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, RowFactory, dict_row, kwargs_row, tuple_row
from psycopg.types.array import ListBinaryDumper

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database, Row
from pin_identity.adapters.postgres.identity_store import PostgresAccessEvents, role_record
from pin_identity.adapters.talent_wire import Undecodable, read_item
from pin_identity.domain.errors import StoreConflictError
from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.model import DEVELOPER_MANAGER_ROLE_CODE, RenderedAccessSnapshot
from pin_identity.domain.talent import ImportStage
from pin_identity.observability.logging import get_logger
from pin_identity.operations.ports.identity_records import RoleRecord
from pin_identity.operations.ports.replica import DefaultGrant, Quarantined, QuarantineEntry, SourceItem

log = get_logger("replica-store")

_LOCK_NAMESPACES = {"Tenants": "talent-tenant:", "Users": "talent-user:"}
# Unique constraints a replica write can meet, by what they protect.
_CONFLICT_FIELDS = {"users_phone_key": "phone", "users_external_talent_user_id_key": "externalTalentUserId"}


def _company_columns(companies: Sequence[CompanyState]) -> dict[str, list[Any]]:
    return {
        "ids": [c.company_id for c in companies],
        "names": [c.name for c in companies],
        "types": [c.company_type for c in companies],
        "statuses": [c.status for c in companies],
        "tax_ids": [c.tax_id for c in companies],
        "external_ids": [c.external_talent_tenant_id for c in companies],
        "versions": [c.replica_version for c in companies],
    }


def _user_columns(users: Sequence[UserState]) -> dict[str, list[Any]]:
    return {
        "ids": [u.user_id for u in users],
        "company_ids": [u.company_id for u in users],
        "types": [u.type for u in users],
        "statuses": [u.status for u in users],
        "phones": [u.phone for u in users],
        "emails": [u.email for u in users],
        "first_names": [u.first_name for u in users],
        "last_names": [u.last_name for u in users],
        "middle_names": [u.middle_name for u in users],
        "external_ids": [u.external_talent_user_id for u in users],
        "versions": [u.replica_version for u in users],
    }


# The page apply's bulk reads (hundreds of rows a statement) go by position, each row straight into its
# record: tests/integration/test_row_decoders.py holds the statements' columns to the order read here.


def _companies_by_tenant(rows: Iterable[tuple[Any, ...]]) -> dict[UUID, CompanyState]:
    """companies_by_tenant, share_companies_by_tenant: CompanyState's fields in order (the 7th the tenant)."""
    return {row[6]: CompanyState(*row) for row in rows}


def _users_by_talent_id(rows: Iterable[tuple[Any, ...]]) -> dict[UUID, UserState]:
    """users_by_talent_id, lock_users_by_talent_id: UserState's fields in order (the 12th the Talent id)."""
    return {row[11]: UserState(*row) for row in rows}


def _access_changes(
    snapshots: Iterable[tuple[Any, ...]], versions: Iterable[tuple[Any, ...]]
) -> dict[UUID, tuple[RenderedAccessSnapshot, int]]:
    """rendered_access_snapshots (RenderedAccessSnapshot's fields in order) and user_access_versions (user id,
    version)."""
    version_of = dict(versions)
    rendered = map(RenderedAccessSnapshot._make, snapshots)
    return {snapshot.user_id: (snapshot, version_of[snapshot.user_id]) for snapshot in rendered}


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# A quarantined snapshot is kept for the operator and for replay; one larger than this is no snapshot.
MAX_STORED_PAYLOAD = 64 * 1024


def _storable(payload: object) -> str | None:
    """The snapshot as jsonb can hold it, always valid JSON: what PostgreSQL refuses is replaced by U+FFFD
    (NUL, lone surrogates); a record that was not JSON is kept as its text; an oversized one is cut."""
    if payload is None:
        return None
    if isinstance(payload, Undecodable):
        payload = {"undecodable": payload.reason, "text": payload.text[:MAX_STORED_PAYLOAD]}
    text = json.dumps(payload, ensure_ascii=False)
    if len(text) > MAX_STORED_PAYLOAD:
        text = json.dumps({"truncated": True, "text": text[:MAX_STORED_PAYLOAD]}, ensure_ascii=False)
    return _LONE_SURROGATE.sub("\ufffd", text).replace("\\u0000", "\\ufffd")


def _quarantine_columns(entries: Sequence[QuarantineEntry]) -> dict[str, list[Any]]:
    return {
        "ids": [e.entry_id for e in entries],
        "run_ids": [e.run_id for e in entries],
        "stages": [e.stage for e in entries],
        "external_ids": [e.external_id for e in entries],
        "error_codes": [e.error_code for e in entries],
        "payloads": [_storable(e.payload) for e in entries],
        "attempts": [e.attempt_count for e in entries],
        "next_attempts": [e.next_attempt_at for e in entries],
        "reasons": [e.reason for e in entries],
    }


def _text(talent_id: UUID | None) -> str | None:
    return str(talent_id) if talent_id else None


def _quarantined(rows: Iterable[DictRow]) -> Quarantined:
    """Rows of due_quarantined or import_failed_items_for_replay, each read again as it was when it came. A
    row without its snapshot (pruned past retention, or never storable) is no item: read back, a missing
    value would pass for a tombstone and delete the entity."""
    items, without_snapshot = [], []
    for row in rows:
        if row["payload"] is None:
            without_snapshot.append(row["id"])
            continue
        item = read_item(ImportStage(row["stage"]), _text(row["external_id"]), row["payload"])
        items.append(SourceItem(item, row["id"], row["attempt_count"], row["next_attempt_at"]))
    return Quarantined(items, without_snapshot)


class PostgresReplicaTransaction(PostgresAccessEvents):
    def _execute(self, name: str, params: dict[str, Any]) -> psycopg.Cursor[Any]:
        return self._read(name, params, tuple_row)

    def _read(self, name: str, params: dict[str, Any], row_factory: RowFactory[Row]) -> psycopg.Cursor[Row]:
        """A named statement whose rows `row_factory` makes (by column name where the rows are few)."""
        cursor = self._conn.cursor(row_factory=row_factory)
        # A batch's columns go as binary arrays: the text format escapes every element in Python (a round's
        # user columns are 5,500 values), the binary one packs them several times faster. An empty or
        # all-NULL list still goes as text (psycopg cannot tell its element type).
        cursor.adapters.register_dumper(list, ListBinaryDumper)
        return cursor.execute(query(name), params)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        if self._conn.info.transaction_status == TransactionStatus.IDLE:
            # transaction() on an idle connection would be a transaction of its own, committed at its end:
            # open the caller's transaction first, so that this block is a savepoint inside it.
            self._conn.execute("SELECT 1")
        try:
            with self._conn.transaction():
                yield
        except errors.UniqueViolation as exc:
            constraint = exc.diag.constraint_name or "unknown"
            raise StoreConflictError(_CONFLICT_FIELDS.get(constraint, constraint)) from None
        except (errors.IntegrityError, errors.DataError) as exc:  # a value the schema refuses
            raise StoreConflictError(type(exc).__name__) from None

    @contextmanager
    def pipelined(self) -> Iterator[None]:
        with self._conn.pipeline():
            yield

    def lock_talent_ids(self, stage: str, talent_ids: Sequence[UUID]) -> None:
        if talent_ids:
            self._execute("lock_talent_ids", {"namespace": _LOCK_NAMESPACES[stage], "ids": list(talent_ids)})

    def companies_by_tenant(
        self, tenant_ids: Sequence[UUID], *, shared: bool = False
    ) -> dict[UUID, CompanyState]:
        if not tenant_ids:
            return {}
        name = "share_companies_by_tenant" if shared else "companies_by_tenant"
        return _companies_by_tenant(self._execute(name, {"tenant_ids": list(tenant_ids)}))

    def lock_managers(self, company_ids: Sequence[UUID]) -> dict[UUID, UUID]:
        if not company_ids:
            return {}
        params = {"company_ids": list(company_ids)}
        return dict(self._execute("lock_managers", params))  # (id, company id) rows, by position

    def managers_without_default_role(
        self, user_ids: Sequence[UUID], role_id: UUID
    ) -> list[tuple[UUID, UUID]]:
        if not user_ids:
            return []
        params = {"user_ids": list(user_ids), "role_id": role_id}
        rows = self._read("managers_without_default_role", params, dict_row)
        return [(row["id"], row["company_id"]) for row in rows]

    def users_by_talent_id(self, talent_ids: Sequence[UUID], *, lock: bool) -> dict[UUID, UserState]:
        if not talent_ids:
            return {}
        name = "lock_users_by_talent_id" if lock else "users_by_talent_id"
        return _users_by_talent_id(self._execute(name, {"talent_ids": list(talent_ids)}))

    def phone_owners(self, phones: Sequence[str]) -> dict[str, UUID]:
        if not phones:
            return {}
        # (phone, user id) rows, a page's worth: as a dict straight away (test_row_decoders holds the order).
        return dict(self._execute("phone_owners", {"phones": list(phones)}))

    def default_role(self) -> RoleRecord:
        role = self._read(
            "default_role", {"code": DEVELOPER_MANAGER_ROLE_CODE}, kwargs_row(role_record)
        ).fetchone()
        if role is None:
            raise RuntimeError(
                f"the {DEVELOPER_MANAGER_ROLE_CODE} system role is missing: run `pin-identity db upgrade`"
            )
        return role

    def deleted_versions(self, stage: str, talent_ids: Sequence[UUID]) -> dict[UUID, int]:
        if not talent_ids:
            return {}
        # (Talent id, version) rows, a page's worth: a dict straight away (test_row_decoders holds the order).
        return dict(
            self._execute("talent_deleted_versions", {"stage": stage, "talent_ids": list(talent_ids)})
        )

    def waiting_versions(self, stage: str, talent_ids: Sequence[UUID]) -> dict[UUID, int]:
        if not talent_ids:
            return {}
        return dict(
            self._execute("talent_waiting_versions", {"stage": stage, "talent_ids": list(talent_ids)})
        )

    def remember_deletions(self, stage: str, versions: Mapping[UUID, int]) -> None:
        if versions:
            params = {"stage": stage, "talent_ids": list(versions), "versions": list(versions.values())}
            self._execute("remember_talent_deletions", params)

    def save_companies(
        self, created: Sequence[CompanyState], updated: Sequence[CompanyState], synced_at: datetime
    ) -> None:
        if created:
            self._execute("insert_replica_companies", {**_company_columns(created), "synced_at": synced_at})
        if updated:
            columns = _company_columns(updated)
            del columns["types"], columns["external_ids"]
            self._execute("update_replica_companies", {**columns, "synced_at": synced_at})

    def save_users(
        self, created: Sequence[UserState], updated: Sequence[UserState], synced_at: datetime
    ) -> None:
        if created:
            self._execute("insert_replica_users", {**_user_columns(created), "synced_at": synced_at})
        if updated:
            self._execute("update_replica_users", {**_user_columns(updated), "synced_at": synced_at})

    def revoke_user_assignments(
        self, user_ids: Sequence[UUID], role_id: UUID | None
    ) -> list[tuple[UUID, UUID]]:
        params = {"user_ids": list(user_ids), "role_id": role_id}
        return [
            (row["user_id"], row["role_id"])
            for row in self._read("revoke_user_assignments", params, dict_row)
        ]

    def grant_default_role(self, role: RoleRecord, grants: Sequence[DefaultGrant]) -> None:
        if not grants:
            return
        params = {
            "role_id": role.role_id,
            "role_company_id": role.company_id,
            "ids": [g.assignment_id for g in grants],
            "user_ids": [g.user_id for g in grants],
            "company_ids": [g.company_id for g in grants],
        }
        self._execute("grant_default_role", params)

    def access_changes(self, user_ids: Sequence[UUID]) -> dict[UUID, tuple[RenderedAccessSnapshot, int]]:
        if not user_ids:
            return {}
        # The fan-out's own rendering (one statement renders every snapshot the access topic carries), and the
        # point versions; both sent before either answer is awaited.
        params = {"user_ids": list(user_ids)}
        with self.pipelined():
            snapshots = self._execute("rendered_access_snapshots", params)
            versions = self._execute("user_access_versions", params)
        return _access_changes(snapshots.fetchall(), versions.fetchall())

    def quarantine(self, entries: Sequence[QuarantineEntry]) -> None:
        """Never fails its batch for what the entries hold: should the schema still refuse a payload, the
        rows are kept without payloads (code, ids and reason remain for the operator)."""
        try:
            with self.savepoint():
                self._write_quarantine(_quarantine_columns(entries))
        except StoreConflictError:
            log.warning("quarantine-payload-refused", items=len(entries))
            # Without its snapshot a row cannot be tried again: it waits for the operator, never for a retry.
            kept = {"payloads": [None] * len(entries), "next_attempts": [None] * len(entries)}
            self._write_quarantine({**_quarantine_columns(entries), **kept})

    def _write_quarantine(self, columns: dict[str, list[Any]]) -> None:
        self._execute("update_quarantined", columns)
        self._execute("insert_quarantined", columns)

    def due_quarantined(self, now: datetime, limit: int) -> list[SourceItem]:
        return _quarantined(self._read("due_quarantined", {"now": now, "limit": limit}, dict_row)).items

    def quarantined_for_replay(self, run_id: UUID | None, entry_ids: Sequence[UUID] | None) -> Quarantined:
        params = {"run_id": run_id, "all": entry_ids is None, "ids": list(entry_ids or [])}
        return _quarantined(self._read("import_failed_items_for_replay", params, dict_row))

    def release_quarantined(self, entry_ids: Sequence[UUID]) -> None:
        self._execute("release_quarantined", {"ids": list(entry_ids)})

    def wake_deferred(self, tenant_ids: Sequence[UUID], now: datetime) -> None:
        if tenant_ids:
            self._execute("wake_deferred_users", {"tenant_ids": [str(t) for t in tenant_ids], "now": now})

    def discard_quarantined(self, stage: str, talent_ids: Sequence[UUID]) -> None:
        if talent_ids:
            self._execute("discard_quarantined", {"stage": stage, "talent_ids": list(talent_ids)})


class PostgresReplicaTransactions:
    """One replica transaction per `with`, on a pooled connection."""

    def __init__(self, database: Database):
        self._database = database

    @contextmanager
    def __call__(self) -> Iterator[PostgresReplicaTransaction]:
        with self._database.transaction() as conn:
            yield PostgresReplicaTransaction(conn)

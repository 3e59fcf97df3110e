"""IdentityTransaction on PostgreSQL: each method is one named query of the catalogue."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import DictRow, dict_row, kwargs_row, scalar_row

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database, read
from pin_identity.adapters.postgres.outbox_writer import write_outbox
from pin_identity.domain.events import CompanyState, OutboxMessage, UserState
from pin_identity.domain.model import ActiveAssignment, RoleStatus, Scope, ScopeType, UserAccessSnapshot
from pin_identity.operations.ports.identity_records import AssignmentRecord, NewAssignment, RoleRecord

_SCOPE_TYPES = {scope_type.value: scope_type for scope_type in ScopeType}


def snapshots_from_rows(rows: Iterable[DictRow]) -> list[UserAccessSnapshot]:
    """Group the rows of `access_snapshots` (ordered by user, assignment) into one snapshot per user; a user
    without an Active assignment comes as one row without one."""
    snapshots: list[UserAccessSnapshot] = []
    for (user_id, company_id), own in groupby(rows, key=itemgetter("user_id", "company_id")):
        assignments = tuple(_assignment(row) for row in own if row["assignment_id"] is not None)
        snapshots.append(UserAccessSnapshot(user_id, company_id, assignments))
    return snapshots


def _assignment(row: DictRow) -> ActiveAssignment:
    scope = Scope(
        _SCOPE_TYPES[row["scope_type"]],
        row["scope_organization_id"],
        row["scope_project_group_id"],
        row["scope_project_id"],
    )
    return ActiveAssignment(row["assignment_id"], row["role_id"], row["role_code"], scope, row["expires_at"])


def role_record(
    *, role_id: UUID, code: str, company_id: UUID | None, status: str, version: int
) -> RoleRecord:
    """A row of lock_role, share_role or default_role, its columns taken by name (kwargs_row)."""
    return RoleRecord(role_id, code, company_id, RoleStatus(status), int(version))


def _assignment_record(*, user_id: UUID, role_id: UUID, status: str) -> AssignmentRecord:
    return AssignmentRecord(user_id, role_id, status == "Active")


class PostgresAccessEvents:
    """AccessEventWriter and commit on one transaction's connection: what the identity and the replica
    transactions share (each extends this, as their ports extend AccessEventWriter and Transaction)."""

    def __init__(self, conn: psycopg.Connection):
        self._conn = conn

    def commit(self) -> None:
        self._conn.commit()

    def access_versions(self, user_ids: Sequence[UUID]) -> dict[UUID, int]:
        rows = read(self._conn, "user_access_versions", {"user_ids": list(user_ids)}, dict_row)
        return {row["user_id"]: int(row["version"]) for row in rows}

    def access_snapshots(self, user_ids: Sequence[UUID]) -> list[UserAccessSnapshot]:
        if not user_ids:
            return []
        return snapshots_from_rows(
            read(self._conn, "access_snapshots", {"user_ids": list(user_ids)}, dict_row)
        )

    def add_events(self, messages: Sequence[OutboxMessage]) -> None:
        write_outbox(self._conn, messages)


class PostgresIdentityTransaction(PostgresAccessEvents):
    def _one(self, name: str, params: dict[str, Any]) -> Any:
        return read(self._conn, name, params, scalar_row).fetchone()

    def insert_company(self, company: CompanyState) -> None:
        params = asdict(company)
        params["id"] = params.pop("company_id")
        self._conn.execute(query("insert_company"), params)

    def insert_user(self, user: UserState) -> None:
        params = asdict(user)
        params["id"] = params.pop("user_id")
        self._conn.execute(query("insert_user"), params)

    def lock_user(self, user_id: UUID) -> bool:
        return self._one("lock_user", {"user_id": user_id}) is not None

    def lock_users_of_role(self, role_id: UUID) -> None:
        self._conn.execute(query("lock_users_of_role"), {"role_id": role_id})

    def insert_role(self, role_id: UUID, code: str, name: str, company_id: UUID | None) -> None:
        self._conn.execute(
            query("insert_role"), {"id": role_id, "code": code, "name": name, "company_id": company_id}
        )

    def lock_role(self, role_id: UUID, *, shared: bool = False) -> RoleRecord | None:
        name = "share_role" if shared else "lock_role"
        return read(self._conn, name, {"role_id": role_id}, kwargs_row(role_record)).fetchone()

    def replace_role_permissions(self, role_id: UUID, codes: Sequence[str], version: int) -> None:
        self._conn.execute(query("delete_role_permissions"), {"role_id": role_id})
        self._conn.execute(query("insert_role_permissions"), {"role_id": role_id, "codes": list(codes)})
        self._conn.execute(query("set_role_version"), {"role_id": role_id, "version": version})

    def archive_role(self, role_id: UUID, version: int) -> None:
        self._conn.execute(query("archive_role"), {"role_id": role_id, "version": version})

    def next_assignment_version(self, user_id: UUID) -> int:
        return int(self._one("next_assignment_version", {"user_id": user_id}))

    def insert_assignment(self, assignment: NewAssignment) -> None:
        role, scope = assignment.role, assignment.scope
        self._conn.execute(
            query("insert_assignment"),
            {
                "id": assignment.assignment_id,
                "role_id": role.role_id,
                "user_id": assignment.user_id,
                "company_id": role.company_id,
                "scope_type": scope.type.value,
                "scope_organization_id": scope.organization_id,
                "scope_project_group_id": scope.project_group_id,
                "scope_project_id": scope.project_id,
                "expires_at": assignment.expires_at,
                "version": assignment.version,
            },
        )

    def holds(self, user_id: UUID, role_id: UUID, scope: Scope) -> bool:
        params = {
            "user_id": user_id,
            "role_id": role_id,
            "scope_type": scope.type.value,
            "scope_organization_id": scope.organization_id,
            "scope_project_group_id": scope.project_group_id,
            "scope_project_id": scope.project_id,
        }
        return bool(self._one("active_grant_exists", params))

    def assignment(self, assignment_id: UUID) -> AssignmentRecord | None:
        params = {"assignment_id": assignment_id}
        return read(self._conn, "assignment_owner", params, kwargs_row(_assignment_record)).fetchone()

    def revoke_assignment(self, assignment_id: UUID, version: int) -> None:
        self._conn.execute(query("revoke_assignment"), {"assignment_id": assignment_id, "version": version})

    def revoke_role_assignments(self, role_id: UUID) -> list[UUID]:
        return read(self._conn, "revoke_role_assignments", {"role_id": role_id}, scalar_row).fetchall()

    def count_active_users(self, role_id: UUID, limit: int) -> int:
        return int(self._one("count_active_users", {"role_id": role_id, "limit": limit}))

    def lock_active_users(self, role_id: UUID) -> list[UUID]:
        return read(self._conn, "lock_active_users_of_role", {"role_id": role_id}, scalar_row).fetchall()

    def enqueue_fanout_task(self, role: RoleRecord, role_version: int, now: datetime) -> UUID:
        params = {
            "id": uuid.uuid4(),
            "role_id": role.role_id,
            "company_id": role.company_id,
            "role_version": role_version,
            "now": now,
        }
        task_id: UUID = self._one("enqueue_fanout_task", params)
        # Delivered at commit: an idle fan-out worker wakes at once instead of at its next poll.
        self._conn.execute(query("notify_fanout_task"), {"task_id": str(task_id)})
        return task_id


class PostgresIdentityTransactions:
    """The IdentityTransactions factory: a pooled connection, one transaction per `with`."""

    def __init__(self, database: Database):
        self._database = database

    @contextmanager
    def __call__(self) -> Iterator[PostgresIdentityTransaction]:
        with self._database.transaction() as conn:
            yield PostgresIdentityTransaction(conn)

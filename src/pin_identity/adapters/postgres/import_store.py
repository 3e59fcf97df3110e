"""The initial import's state on PostgreSQL: runs, leased pages, the run lock, the dry run's memory."""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, fields
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import DictRow, dict_row, kwargs_row, scalar_row
from psycopg.types.json import Jsonb

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database, Fence, read
from pin_identity.adapters.postgres.replica_store import PostgresReplicaTransaction
from pin_identity.domain.errors import LeaseLostError
from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.import_run import (
    RUN_LOCK_KEY,
    ImportMode,
    ImportPage,
    ImportRequest,
    ImportRun,
    PageProgress,
    PageStatus,
    PlanStep,
    RunEnding,
    RunStatus,
    StageCounters,
)
from pin_identity.domain.lease import Release
from pin_identity.domain.talent import ImportStage
from pin_identity.operations.ports.import_records import FailedItem

_COUNTERS = tuple(field.name for field in fields(StageCounters))


def _run_from_row(row: DictRow) -> ImportRun:
    """A row of import_runs: its columns are named as ImportRun's fields, but for the stages' counters."""
    mode, status = ImportMode(row.pop("mode")), RunStatus(row.pop("status"))
    companies, users = _counters(row, "companies"), _counters(row, "users")
    return ImportRun(mode=mode, status=status, companies=companies, users=users, **row)


def _counters(row: DictRow, stage: str) -> StageCounters:
    """Takes a stage's counters out of an import_runs row (`companies_planned`, ..., `users_failed`)."""
    return StageCounters(**{counter: row.pop(f"{stage}_{counter}") for counter in _COUNTERS})


def _failed_item(*, stage: str, **columns: Any) -> FailedItem:
    """A row of import_failed_items, whose columns are named as FailedItem's fields."""
    return FailedItem(stage=ImportStage(stage), **columns)


class PostgresDryRunMemory:
    """What a dry run would have written: its companies' and users' states, and who would hold which phone;
    kept with the run (deleted with it)."""

    def __init__(self, conn: psycopg.Connection, run_id: UUID):
        self._conn, self._run_id = conn, run_id

    def companies(self, tenant_ids: Sequence[UUID]) -> dict[UUID, CompanyState]:
        return {
            talent: CompanyState(**_state(s, _COMPANY_IDS))
            for talent, s in self._states("Tenants", tenant_ids)
        }

    def users(self, talent_ids: Sequence[UUID]) -> dict[UUID, UserState]:
        return {talent: UserState(**_state(s, _USER_IDS)) for talent, s in self._states("Users", talent_ids)}

    def _states(self, stage: str, ids: Sequence[UUID]) -> list[tuple[UUID, dict[str, Any]]]:
        if not ids:
            return []
        params = {"run_id": self._run_id, "stage": stage, "ids": list(ids)}
        return [
            (row["external_id"], row["state"]) for row in read(self._conn, "dry_run_states", params, dict_row)
        ]

    def phones(self, phones: Sequence[str]) -> dict[str, UUID]:
        if not phones:
            return {}
        params = {"run_id": self._run_id, "phones": list(phones)}
        rows = read(self._conn, "dry_run_phones", params, dict_row)
        return {row["phone"]: row["external_talent_user_id"] for row in rows}

    def remember(
        self, stage: str, states: Mapping[UUID, CompanyState | UserState], phones: Mapping[str, UUID]
    ) -> None:
        params = {
            "run_id": self._run_id,
            "stage": stage,
            "ids": list(states),
            "states": [Jsonb(asdict(state), dumps=_json) for state in states.values()],
            "phones": list(phones),
            "users": list(phones.values()),
        }
        self._conn.execute(query("remember_dry_run"), params)


_COMPANY_IDS = ("company_id", "external_talent_tenant_id")
_USER_IDS = ("user_id", "company_id", "external_talent_user_id")


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


def _state(stored: dict[str, Any], ids: Sequence[str]) -> dict[str, Any]:
    """A stored state's fields, its ids uuids again."""
    return {**stored, **{field: UUID(stored[field]) if stored[field] else None for field in ids}}


class PostgresImportPageTransaction:
    """An import page's transaction: the replica transaction and the page's own statements share its
    connection, so one commit ends both."""

    def __init__(self, conn: psycopg.Connection, now: datetime):
        self._conn, self._now = conn, now
        self.replica = PostgresReplicaTransaction(conn)

    def commit(self) -> None:
        self.replica.commit()

    def complete_page(self, page: ImportPage, counters: StageCounters, *, count_planned: bool) -> None:
        params = {
            "page_id": page.page_id,
            "claim_id": page.claim_id,
            "planned": counters.planned,
            "applied": counters.applied,
            "skipped": counters.skipped,
            "failed": counters.failed,
            "count_planned": count_planned,
            "now": self._now,
        }
        if self._conn.execute(query("complete_import_page"), params).fetchone() is None:
            raise LeaseLostError(str(page.page_id))

    def dry_run_memory(self, run_id: UUID) -> PostgresDryRunMemory:
        return PostgresDryRunMemory(self._conn, run_id)

    def talent_users_of_tenant(self, tenant_id: UUID, user_ids: Sequence[UUID]) -> set[UUID]:
        params = {"tenant_id": tenant_id, "user_ids": list(user_ids)}
        return set(read(self._conn, "talent_users_of_tenant", params, scalar_row))


class PostgresImportStore:
    """The runs and their pages; the pages' leases follow pin_identity.domain.lease (leases.sql has the
    conditions the statements share with the fan-out's tasks)."""

    def __init__(self, database: Database):
        self._database = database

    def _one_run(self, run_id: UUID | None, *, running_only: bool) -> ImportRun | None:
        params = {"run_id": run_id, "running_only": running_only}
        row = self._database.fetch_one("import_runs", params, dict_row)
        return _run_from_row(row) if row else None

    def running_run(self) -> ImportRun | None:
        return self._one_run(None, running_only=True)

    def load_run(self, run_id: UUID) -> ImportRun | None:
        return self._one_run(run_id, running_only=False)

    def latest_run(self) -> ImportRun | None:
        return self._one_run(None, running_only=False)

    def create_run(self, request: ImportRequest, correlation_id: UUID, now: datetime) -> ImportRun:
        run_id = uuid.uuid4()
        params = {
            "id": run_id,
            "mode": request.mode.value,
            "tenant_filter": request.tenant_filter,
            "page_size": request.page_size,
            "dry_run": request.dry_run,
            "correlation_id": correlation_id,
            "now": now,
        }
        self._database.execute("create_import_run", params)
        created = self.load_run(run_id)
        assert created is not None
        return created

    def replica_company_count(self, tenant_filter: UUID | None) -> int:
        [count] = self._database.fetch("replica_company_count", {"tenant_filter": tenant_filter}, scalar_row)
        return int(count)

    def add_planned_pages(self, run: ImportRun, stage: ImportStage, step: PlanStep) -> bool:
        params = {
            "run_id": run.run_id,
            "stage": stage.value,
            "page_no": run.plan_page_no,
            "cursor": run.plan_cursor,
            "items": sum(p.items_planned for p in step.pages),
            "complete": step.complete,
            "next_cursor": step.next_cursor,
            "next_page_no": run.plan_page_no + len(step.pages),
            "page_nos": [p.page_no for p in step.pages],
            "cursors": [p.cursor for p in step.pages],
            "planned": [p.items_planned for p in step.pages],
        }
        with self._database.connection() as conn:
            if conn.execute(query("advance_import_planning"), params).fetchone() is None:
                return False
            if step.pages:
                conn.execute(query("add_import_pages"), params)
            conn.commit()
        return True

    def progress(self, run_id: UUID) -> PageProgress:
        rows = self._database.fetch("import_page_progress", {"run_id": run_id}, dict_row)
        return PageProgress(
            {(ImportStage(row["stage"]), PageStatus(row["status"])): row["pages"] for row in rows}
        )

    def page_cursors(self, run_id: UUID, stage: ImportStage) -> list[str | None]:
        params = {"run_id": run_id, "stage": stage.value}
        return self._database.fetch("import_page_cursors", params, scalar_row)

    def stage_times(self, run_id: UUID, stage: ImportStage) -> tuple[datetime, datetime] | None:
        params = {"run_id": run_id, "stage": stage.value}
        row = self._database.fetch_one("import_stage_times", params, dict_row)
        if row is None or row["started_at"] is None:
            return None
        return row["started_at"], row["ended_at"]

    def finish_run(self, run_id: UUID, ending: RunEnding, now: datetime) -> bool:
        params = {
            "run_id": run_id,
            "status": ending.status.value,
            "now": now,
            "error_code": ending.error_code,
            "error": ending.error,
        }
        return bool(self._database.execute("finish_import_run", params))

    def fail_exhausted(self, now: datetime, max_attempts: int) -> int:
        params = {"now": now, "max_attempts": max_attempts}
        return len(self._database.execute("fail_exhausted_import_pages", params))

    def claim(
        self, claim_id: UUID, now: datetime, lease_until: datetime, run_id: UUID | None
    ) -> ImportPage | None:
        params = {
            "claim_id": claim_id,
            "now": now,
            "lease_until": lease_until,
            "run_id": run_id,
            "holder": self._database.holder_key(),
        }
        row = self._database.fetch_one("claim_import_page", params, dict_row)
        if row is None:
            return None
        stage = ImportStage(row["stage"])
        return ImportPage(
            row["id"], row["run_id"], stage, row["page_no"], row["cursor"], row["attempt_count"], claim_id
        )

    @contextmanager
    def page_transaction(
        self, page: ImportPage, now: datetime, lease_until: datetime
    ) -> Iterator[PostgresImportPageTransaction]:
        params = {"page_id": page.page_id, "claim_id": page.claim_id, "now": now, "lease_until": lease_until}
        with self._database.transaction(Fence("renew_import_page_lease", params, page.page_id)) as conn:
            yield PostgresImportPageTransaction(conn, now)

    def release(
        self, page: ImportPage, now: datetime, release: Release, max_attempts: int
    ) -> PageStatus | None:
        params = {
            "page_id": page.page_id,
            "claim_id": page.claim_id,
            "now": now,
            "available_at": release.available_at,
            "count_attempt": release.count_attempt,
            "max_attempts": max_attempts,
            "error": release.error,
        }
        status = self._database.fetch_one("release_import_page", params, scalar_row)
        return PageStatus(status) if status is not None else None

    # ---------------------------------------------------------------- operator commands

    def request_cancel(self, run_id: UUID) -> bool:
        """Running -> Cancelled; pages already claimed still finish (their claims stay valid)."""
        return bool(self._database.execute("request_import_cancel", {"run_id": run_id}))

    def reset_leases(self, run_id: UUID, now: datetime) -> int:
        return len(self._database.execute("reset_import_leases", {"run_id": run_id, "now": now}))

    def failed_items(self, run_id: UUID | None) -> list[FailedItem]:
        return self._database.fetch("import_failed_items", {"run_id": run_id}, kwargs_row(_failed_item))


class PostgresRunLock:
    """The one-run lock, held by a session of its own: it outlives no crash (the session ends with the
    process) and survives nothing else, which is what makes a Running run resumable by anyone."""

    def __init__(self, database: Database, key: str = RUN_LOCK_KEY):
        self._database, self._key = database, key
        self._conn: psycopg.Connection | None = None

    def try_acquire(self) -> bool:
        if self._conn is not None:
            return True
        name = f"pin-identity talent-import {socket.gethostname()} pid {os.getpid()}"
        conn = self._database.dedicated(name=name[:63])
        if read(conn, "try_import_lock", {"key": self._key}, scalar_row).fetchone():
            self._conn = conn
            return True
        conn.close()
        return False

    def held(self) -> bool:
        """Whether the lock's session is still alive (a dropped connection has lost the lock)."""
        if self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error:
            self.release()
            return False
        return True

    def release(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        try:
            # Ending the session releases the lock too, but only once the server has seen the session end,
            # some time after close() returns: meanwhile the lock would still be reported held, and refused.
            conn.execute(query("release_import_lock"), {"key": self._key})
        except psycopg.Error:
            pass  # the session is gone, and its lock with it
        finally:
            conn.close()

    def holder(self) -> str | None:
        with self._database.connection() as conn:
            row = read(conn, "import_lock_holder", {"key": self._key}, dict_row).fetchone()
        if row is None:
            return None
        who = row["application_name"] or "unknown application"
        return (
            f"{who} (backend pid {row['pid']}, client {row['client']}, "
            f"since {row['backend_start']:%Y-%m-%d %H:%M:%S%z})"
        )

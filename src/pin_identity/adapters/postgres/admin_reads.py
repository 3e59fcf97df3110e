"""What the operator console reads beside the stores' own reads: recent runs, roles with their size, dead
letters. Rows come back as dicts named as the HTTP API names them (camelCase)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from pin_identity.adapters.postgres.database import Database

_COUNTERS = ("planned", "applied", "skipped", "failed")


@dataclass(frozen=True)
class DeadLetters:
    count: int
    newest_failed_at: datetime | None


def _run_summary(row: tuple[Any, ...]) -> dict[str, Any]:
    return {
        "runId": row[0],
        "mode": row[1],
        "status": row[2],
        "dryRun": row[3],
        "talentTenantIdFilter": row[4],
        "pageSize": row[5],
        "companies": dict(zip(_COUNTERS, row[6:10], strict=True)),
        "users": dict(zip(_COUNTERS, row[10:14], strict=True)),
        "startedAt": row[14],
        "finishedAt": row[15],
        "errorCode": row[16],
        "quarantined": row[17],
    }


def _role(row: tuple[Any, ...]) -> dict[str, Any]:
    names = ("roleId", "code", "name", "companyId", "companyName", "status", "version", "permissions")
    return {**dict(zip(names, row[:8], strict=True)), "holders": row[8]}


class PostgresAdminReads:
    def __init__(self, database: Database):
        self._database = database

    def recent_runs(self, limit: int) -> list[dict[str, Any]]:
        return [_run_summary(row) for row in self._database.execute("recent_import_runs", {"limit": limit})]

    def roles(
        self, *, role_id: UUID | None = None, code: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        params = {"role_id": role_id, "code": code, "limit": limit}
        return [_role(row) for row in self._database.execute("admin_roles", params)]

    def dead_letters(self) -> DeadLetters:
        [(count, newest)] = self._database.execute("outbox_dead_letter_summary", {})
        return DeadLetters(int(count), newest)

"""What the operator console reads beside the stores' own reads: recent runs, roles with their size, dead
letters, as the operator service's read models. Rows are read by column name (the statements alias every
column as the read model names it), so a reordered SELECT cannot shift a field."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from pin_identity.adapters.postgres.database import Database
from pin_identity.domain.import_run import ImportMode, RunStatus
from pin_identity.domain.model import RoleStatus
from pin_identity.operations.ports.health_sources import DeadLetters
from pin_identity.operations.ports.identity_records import RoleView
from pin_identity.operations.ports.import_records import ImportRunSummary, StageCounts

Columns = dict[str, Any]  # one row, by column name


def _counters(row: Columns, stage: str) -> StageCounts:
    return StageCounts(
        planned=row[f"{stage}_planned"],
        applied=row[f"{stage}_applied"],
        skipped=row[f"{stage}_skipped"],
        failed=row[f"{stage}_failed"],
    )


def _run_summary(row: Columns) -> ImportRunSummary:
    return ImportRunSummary(
        run_id=row["run_id"],
        mode=ImportMode(row["mode"]),
        status=RunStatus(row["status"]),
        dry_run=row["dry_run"],
        talent_tenant_id_filter=row["tenant_filter"],
        page_size=row["page_size"],
        companies=_counters(row, "companies"),
        users=_counters(row, "users"),
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        error_code=row["error_code"],
        quarantined=row["quarantined"],
    )


def _role(row: Columns) -> RoleView:
    return RoleView(**{**row, "status": RoleStatus(row["status"])})


class PostgresAdminReads:
    """RunSummaries, RoleSummaries and DeadLetterReads over the database."""

    def __init__(self, database: Database):
        self._database = database

    def _rows(self, name: str, params: dict[str, Any]) -> list[Columns]:
        return self._database.fetch(name, params, dict_row)

    def recent_runs(self, limit: int) -> list[ImportRunSummary]:
        return [_run_summary(row) for row in self._rows("recent_import_runs", {"limit": limit})]

    def roles(
        self, *, role_id: UUID | None = None, code: str | None = None, limit: int = 100
    ) -> list[RoleView]:
        params = {"role_id": role_id, "code": code, "limit": limit}
        return [_role(row) for row in self._rows("admin_roles", params)]

    def dead_letters(self) -> DeadLetters:
        [summary] = self._rows("outbox_dead_letter_summary", {})
        return DeadLetters(int(summary["count"]), summary["newest_failed_at"])

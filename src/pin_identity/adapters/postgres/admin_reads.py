"""What the operator console reads beside the stores' own reads: recent runs, roles with their size, dead
letters, as the operator service's read models."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from pin_identity.adapters.postgres.database import Database
from pin_identity.domain.model import RoleStatus
from pin_identity.domain.talent_import import ImportMode, RunStatus, StageCounters
from pin_identity.operations.read_models import DeadLetters, RoleSummary, RunSummary


def _run_summary(row: tuple[Any, ...]) -> RunSummary:
    return RunSummary(
        run_id=row[0],
        mode=ImportMode(row[1]),
        status=RunStatus(row[2]),
        dry_run=row[3],
        tenant_filter=row[4],
        page_size=row[5],
        companies=StageCounters(*row[6:10]),
        users=StageCounters(*row[10:14]),
        started_at=row[14],
        finished_at=row[15],
        error_code=row[16],
        quarantined=row[17],
    )


def _role(row: tuple[Any, ...]) -> RoleSummary:
    return RoleSummary(
        role_id=row[0],
        code=row[1],
        name=row[2],
        company_id=row[3],
        company_name=row[4],
        status=RoleStatus(row[5]),
        version=row[6],
        permissions=tuple(row[7]),
        holders=row[8],
    )


class PostgresAdminReads:
    """RunSummaries, RoleSummaries and DeadLetterReads over the database."""

    def __init__(self, database: Database):
        self._database = database

    def recent_runs(self, limit: int) -> list[RunSummary]:
        return [_run_summary(row) for row in self._database.execute("recent_import_runs", {"limit": limit})]

    def roles(
        self, *, role_id: UUID | None = None, code: str | None = None, limit: int = 100
    ) -> list[RoleSummary]:
        params = {"role_id": role_id, "code": code, "limit": limit}
        return [_role(row) for row in self._database.execute("admin_roles", params)]

    def dead_letters(self) -> DeadLetters:
        [(count, newest)] = self._database.execute("outbox_dead_letter_summary", {})
        return DeadLetters(int(count), newest)

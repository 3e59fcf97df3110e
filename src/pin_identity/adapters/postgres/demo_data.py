"""The demo's reads of its own progress and checks (it writes through the use cases, like production)."""

from __future__ import annotations

from uuid import UUID

from pin_identity.adapters.postgres.database import Database
from pin_identity.domain.model import DEVELOPER_MANAGER_ROLE_CODE


class PostgresDemoReads:
    def __init__(self, database: Database):
        self._database = database

    def fanout_progress(self, task_id: UUID) -> tuple[str, int]:
        rows = self._database.execute("fanout_task_progress", {"task_id": task_id})
        return (str(rows[0][0]), int(rows[0][1])) if rows else ("missing", 0)

    def outbox_is_empty(self) -> bool:
        rows = self._database.execute("outbox_is_empty", {})
        return bool(rows and rows[0][0])

    def talent_managers_with_one_default_role(self) -> int:
        rows = self._database.execute(
            "talent_managers_with_one_default_role", {"code": DEVELOPER_MANAGER_ROLE_CODE}
        )
        return int(rows[0][0]) if rows else 0

    def active_holders(self, role_id: UUID) -> int:
        rows = self._database.execute("count_active_users", {"role_id": role_id, "limit": 10_000_000})
        return int(rows[0][0]) if rows else 0

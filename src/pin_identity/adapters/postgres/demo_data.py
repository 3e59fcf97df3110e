"""The demo's reads of its own progress and checks (it writes through the use cases, like production)."""

from __future__ import annotations

from uuid import UUID

from psycopg.rows import dict_row, scalar_row

from pin_identity.adapters.postgres.database import Database
from pin_identity.domain.model import DEVELOPER_MANAGER_ROLE_CODE


class PostgresDemoReads:
    def __init__(self, database: Database):
        self._database = database

    def fanout_progress(self, task_id: UUID) -> tuple[str, int]:
        task = self._database.fetch_one("fanout_task_status", {"task_id": task_id}, dict_row)
        return (str(task["status"]), int(task["processed_count"])) if task else ("missing", 0)

    def outbox_is_empty(self) -> bool:
        return bool(self._database.fetch_one("outbox_is_empty", {}, scalar_row))

    def talent_managers_with_one_default_role(self) -> int:
        params = {"code": DEVELOPER_MANAGER_ROLE_CODE}
        return int(self._database.fetch_one("talent_managers_with_one_default_role", params, scalar_row) or 0)

    def active_holders(self, role_id: UUID) -> int:
        params = {"role_id": role_id, "limit": 10_000_000}
        return int(self._database.fetch_one("count_active_users", params, scalar_row) or 0)

"""The demo's reads of its own progress and checks (it writes through the use cases, like production)."""

from __future__ import annotations

from uuid import UUID

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database
from pin_identity.domain.model import DEVELOPER_MANAGER_ROLE_CODE


def fanout_progress(database: Database, task_id: UUID) -> tuple[str, int]:
    with database.connection() as conn:
        row = conn.execute(query("fanout_task_progress"), {"task_id": task_id}).fetchone()
    return (str(row[0]), int(row[1])) if row else ("missing", 0)


def outbox_is_empty(database: Database) -> bool:
    with database.connection() as conn:
        row = conn.execute(query("outbox_is_empty")).fetchone()
    return bool(row and row[0])


def talent_managers_with_one_default_role(database: Database) -> int:
    with database.connection() as conn:
        params = {"code": DEVELOPER_MANAGER_ROLE_CODE}
        row = conn.execute(query("talent_managers_with_one_default_role"), params).fetchone()
    return int(row[0]) if row else 0


def active_holders(database: Database, role_id: UUID) -> int:
    with database.connection() as conn:
        row = conn.execute(query("count_active_users"), {"role_id": role_id, "limit": 10_000_000}).fetchone()
    return int(row[0]) if row else 0

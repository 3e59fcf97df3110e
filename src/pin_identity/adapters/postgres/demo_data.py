"""Bulk demo data (the demo's large role); production data only ever arrives through the use cases."""

from __future__ import annotations

from uuid import UUID

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database

DEMO_PHONE_BASE = 9_500_000_000


def add_role_members(database: Database, *, company_id: UUID, role_id: UUID, count: int) -> int:
    """`count` new users of the company, each granted the role; returns how many were created."""
    with database.connection() as conn:
        row = conn.execute(query("count_users")).fetchone()
        phone_base = DEMO_PHONE_BASE + (int(row[0]) if row else 0)  # past every phone a rerun already used
        rows = conn.execute(
            query("demo_insert_users"), {"company_id": company_id, "count": count, "phone_base": phone_base}
        ).fetchall()
        user_ids = [row[0] for row in rows]
        conn.execute(
            query("demo_grant_role"), {"role_id": role_id, "company_id": company_id, "user_ids": user_ids}
        )
    return len(user_ids)


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
        row = conn.execute(query("talent_managers_with_one_default_role")).fetchone()
    return int(row[0]) if row else 0


def active_holders(database: Database, role_id: UUID) -> int:
    with database.connection() as conn:
        row = conn.execute(query("count_active_users"), {"role_id": role_id, "limit": 10_000_000}).fetchone()
    return int(row[0]) if row else 0

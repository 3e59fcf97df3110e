"""`maintenance prune`: what is kept only for a while (finished work, the PII of quarantined snapshots)."""

from __future__ import annotations

from datetime import datetime

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database


def prune(database: Database, cutoff: datetime) -> dict[str, int]:
    """One transaction: finished fan-out tasks, finished import runs with their pages, quarantine payloads."""
    with database.connection() as conn:
        pruned = {
            name: len(conn.execute(query(f"prune_{name}"), {"cutoff": cutoff}).fetchall())
            for name in ("fanout_tasks", "import_runs", "quarantine_payloads")
        }
        conn.commit()
    return pruned

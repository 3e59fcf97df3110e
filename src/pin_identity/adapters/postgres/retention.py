"""`maintenance prune`: what is kept only for a while (finished work, the PII of quarantined snapshots)."""

from __future__ import annotations

from datetime import datetime

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database

_PRUNES = {
    "fanout_tasks": "prune_fanout_tasks",
    "import_runs": "prune_import_runs",
    "quarantine_payloads": "prune_quarantine_payloads",
}


def prune(database: Database, cutoff: datetime) -> dict[str, int]:
    """One transaction: finished fan-out tasks, finished import runs with their pages, quarantine payloads."""
    with database.connection() as conn:
        pruned = {
            what: len(conn.execute(query(statement), {"cutoff": cutoff}).fetchall())
            for what, statement in _PRUNES.items()
        }
        conn.commit()
    return pruned

"""`maintenance prune` on PostgreSQL: finished work, and the PII of quarantined snapshots, past retention."""

from __future__ import annotations

from datetime import datetime

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database
from pin_identity.operations.ports.pruning import PruneResult


class PostgresRetention:
    def __init__(self, database: Database):
        self._database = database

    def prune(self, cutoff: datetime) -> PruneResult:
        """One transaction: Completed fan-out tasks (never Failed ones), finished import runs with their
        pages (and their quarantine), quarantine payloads."""
        with self._database.connection() as conn:
            params = {"cutoff": cutoff}
            pruned = PruneResult(
                fanout_tasks=len(conn.execute(query("prune_fanout_tasks"), params).fetchall()),
                import_runs=len(conn.execute(query("prune_import_runs"), params).fetchall()),
                quarantine_payloads=len(conn.execute(query("prune_quarantine_payloads"), params).fetchall()),
            )
            conn.commit()
        return pruned

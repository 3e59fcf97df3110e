"""Pruning what no one needs any more."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from pydantic import Field

from pin_identity.domain.api_model import ApiModel


class PruneResult(ApiModel):
    """What `maintenance prune` removed: rows of finished work, and quarantine payloads emptied."""

    fanout_tasks: int = Field(
        description="Completed fan-out tasks deleted (a Failed one stays until replayed or discarded)."
    )
    import_runs: int = Field(description="Finished import runs deleted, with their pages and quarantine.")
    quarantine_payloads: int = Field(description="Quarantined snapshots (PII) emptied.")


class Retention(Protocol):
    def prune(self, cutoff: datetime) -> PruneResult:
        """In one transaction: finished work and quarantine payloads last changed before the cutoff."""
        ...

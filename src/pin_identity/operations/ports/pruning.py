"""Pruning what no one needs any more."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from pin_identity.operations.read_models import PruneResult


class Retention(Protocol):
    def prune(self, cutoff: datetime) -> PruneResult:
        """In one transaction: finished work and quarantine payloads last changed before the cutoff."""
        ...

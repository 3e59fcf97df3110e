"""`maintenance prune`: what is kept only for a while (finished work, the PII of quarantined snapshots)."""

from __future__ import annotations

from datetime import timedelta

from pin_identity.domain.clock import Clock
from pin_identity.operations.action_log import Actor, admin_action
from pin_identity.operations.ports.pruning import PruneResult, Retention


class RetentionAdmin:
    def __init__(self, retention: Retention, clock: Clock):
        self._retention, self._clock = retention, clock

    def prune(self, older_than: timedelta, *, who: Actor) -> PruneResult:
        """Completed fan-out tasks, finished import runs with their pages, and quarantine payloads older than
        the cutoff, in one transaction. Failed fan-out tasks stay until replayed or discarded
        (FanOutAdmin): their users past the cursor never got their event."""
        pruned = self._retention.prune(self._clock.now() - older_than)
        admin_action(
            "maintenance-prune",
            who,
            older_than_s=int(older_than.total_seconds()),
            fanout_tasks=pruned.fanout_tasks,
            import_runs=pruned.import_runs,
            quarantine_payloads=pruned.quarantine_payloads,
        )
        return pruned

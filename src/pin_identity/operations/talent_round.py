"""One round of a Talent batch (see talent_replica): what it is applied with, and what its items came to.

A round is one stage's items, each entity at most once. Once talent_decisions has decided each item and
talent_writes has written the round, settle() turns each decision into the item's outcome and keeps the
quarantine in step, the same way for both stages: a Quarantine decision is written as a row (with its
reason), an item that applies leaves the quarantine, and a tombstone drops its entity's quarantined snapshots.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from pin_identity.domain.import_run import StageCounters
from pin_identity.domain.talent import (
    Change,
    CompanyChange,
    Decision,
    ImportStage,
    ItemResult,
    Quarantine,
    Skip,
    SyncErrorCode,
    TenantSnapshot,
    UserChange,
    UserSnapshot,
)
from pin_identity.operations.ports.replica import DryRunMemory, QuarantineEntry, QuarantineRows, SourceItem


@dataclass(frozen=True)
class ApplyOptions:
    """Who applies. `retry_at` (the consumer) schedules another try of an item whose tenant is missing;
    a dry run decides and counts without writing, remembering what it would have written in `memory`."""

    run_id: UUID | None = None
    dry_run: bool = False
    memory: DryRunMemory | None = None
    retry_at: Callable[[int], datetime | None] | None = None


@dataclass(frozen=True)
class ItemOutcome:
    stage: ImportStage
    external_id: UUID | None
    result: ItemResult
    change: Change | None = None
    stale: bool = False
    error: SyncErrorCode | None = None
    retry_at: datetime | None = None
    reason: str | None = None


@dataclass
class BatchOutcome:
    outcomes: list[ItemOutcome] = field(default_factory=list)
    correlation_id: UUID | None = None  # the correlationId of the batch's events

    def count(self, result: ItemResult) -> int:
        return sum(1 for outcome in self.outcomes if outcome.result is result)

    @property
    def applied(self) -> int:
        return self.count(ItemResult.APPLIED)

    @property
    def skipped(self) -> int:
        return self.count(ItemResult.SKIPPED)

    @property
    def failed(self) -> int:
        return self.count(ItemResult.FAILED)

    def counters(self, planned: int) -> StageCounters:
        """What the batch came to, counted in one pass, beside how many items it was planned with."""
        results = Counter(outcome.result for outcome in self.outcomes)
        return StageCounters(
            planned, results[ItemResult.APPLIED], results[ItemResult.SKIPPED], results[ItemResult.FAILED]
        )


def settle(
    tx: QuarantineRows,
    stage: ImportStage,
    options: ApplyOptions,
    decided: Sequence[tuple[SourceItem, Decision]],
) -> list[ItemOutcome]:
    """Each item's outcome, in order, as its decision says; the quarantine written as they came to (not in a
    dry run, which writes nothing)."""
    outcomes: list[ItemOutcome] = []
    entries: list[QuarantineEntry] = []
    released: list[UUID] = []
    for source, decision in decided:
        if isinstance(decision, Quarantine):
            outcome, entry = _failed(stage, options, source, decision)
            entries.append(entry)
        else:
            outcome = _decided(stage, source, decision)
            if source.quarantine_id is not None:  # it applies now: it leaves the quarantine
                released.append(source.quarantine_id)
        outcomes.append(outcome)
    if not options.dry_run:
        _write(tx, stage, _tombstoned(decided), entries, released)
    return outcomes


def _decided(
    stage: ImportStage, source: SourceItem, decision: CompanyChange | UserChange | Skip
) -> ItemOutcome:
    entity = source.item.talent_id
    if isinstance(decision, Skip):
        return ItemOutcome(stage, entity, ItemResult.SKIPPED, stale=decision.stale)
    return ItemOutcome(stage, entity, ItemResult.APPLIED, change=decision.change)


def _failed(
    stage: ImportStage, options: ApplyOptions, source: SourceItem, quarantine: Quarantine
) -> tuple[ItemOutcome, QuarantineEntry]:
    attempts = source.attempts + 1
    retry_at = None
    if quarantine.code is SyncErrorCode.COMPANY_NOT_FOUND:
        # The consumer defers it with its back-off; an operator's replay keeps a deferred item deferred.
        retry_at = options.retry_at(attempts) if options.retry_at else source.deferred_until
    entity = source.item.talent_id
    entry = QuarantineEntry(
        entry_id=source.quarantine_id or uuid.uuid4(),
        run_id=options.run_id,
        stage=stage.value,
        external_id=entity,
        error_code=quarantine.code.value,
        payload=source.item.payload,
        attempt_count=attempts,
        next_attempt_at=retry_at,
        reason=quarantine.reason,
    )
    outcome = ItemOutcome(
        stage, entity, ItemResult.FAILED, error=quarantine.code, retry_at=retry_at, reason=quarantine.reason
    )
    return outcome, entry


def _tombstoned(decided: Sequence[tuple[SourceItem, Decision]]) -> list[UUID]:
    """The entities a tombstone (a deletion without a version) of the round deleted."""
    snapshots = [source.item.snapshot for source, decision in decided if not isinstance(decision, Quarantine)]
    return sorted(
        {
            s.tenant_id if isinstance(s, TenantSnapshot) else s.user_id
            for s in snapshots
            if isinstance(s, TenantSnapshot | UserSnapshot) and s.is_deleted and s.version is None
        }
    )


def _write(
    tx: QuarantineRows,
    stage: ImportStage,
    tombstoned: list[UUID],
    entries: list[QuarantineEntry],
    released: list[UUID],
) -> None:
    """A tombstone is the entity's last record: no snapshot of it that any quarantine holds may apply after it
    (an operator's replay would bring the deleted entity back). Then the round's new rows, and the rows of
    items that applied now released."""
    if tombstoned:
        tx.discard_quarantined(stage.value, tombstoned)
    if entries:
        tx.quarantine(entries)
    if released:
        tx.release_quarantined(released)

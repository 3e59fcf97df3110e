"""One round of a Talent batch (see talent_replica): what applying its items asks for and what they came to.

A round is one stage's items, each entity at most once. The stage's rules (talent_tenants, talent_users)
decide every item of it against the replica and write the round in bulk; what an item came to, and what the
quarantine gains or loses by it, is kept here the same way for both stages.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar
from uuid import UUID

from pin_identity.domain.import_run import StageCounters
from pin_identity.domain.talent import (
    Change,
    CompanyChange,
    ImportStage,
    InvalidSnapshot,
    ItemResult,
    Quarantine,
    Skip,
    SyncErrorCode,
    TenantSnapshot,
    UserChange,
    UserSnapshot,
)
from pin_identity.operations.context import Context
from pin_identity.operations.ports.replica import (
    DryRunMemory,
    QuarantineEntry,
    ReplicaTransaction,
    SourceItem,
)

_Snapshot = TypeVar("_Snapshot", TenantSnapshot, UserSnapshot)


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


class Round:
    """The transaction, the stage and the options a round is applied with, and its items' outcomes."""

    def __init__(self, tx: ReplicaTransaction, stage: ImportStage, ctx: Context, options: ApplyOptions):
        self.tx, self.stage, self.ctx, self.options = tx, stage, ctx, options
        self._quarantine: list[QuarantineEntry] = []
        self._released: list[UUID] = []

    def fresh(self) -> Round:
        """The same round with nothing recorded yet: what it recorded was rolled back with its savepoint."""
        return Round(self.tx, self.stage, self.ctx, self.options)

    @property
    def writes(self) -> bool:
        """False for a dry run, which decides and counts but writes nothing."""
        return not self.options.dry_run

    def snapshot(self, source: SourceItem, kind: type[_Snapshot]) -> _Snapshot | Quarantine:
        """The item's snapshot, or why it is none (read once, where it came in)."""
        snapshot = source.item.snapshot
        if isinstance(snapshot, kind):
            return snapshot
        reason = snapshot.reason if isinstance(snapshot, InvalidSnapshot) else f"not a {self.stage} snapshot"
        return Quarantine(SyncErrorCode.INVALID_PAYLOAD, reason)

    def outcomes(
        self,
        snapshots: Sequence[tuple[SourceItem, _Snapshot | Quarantine]],
        decide: Callable[[_Snapshot], CompanyChange | UserChange | Skip | Quarantine],
    ) -> list[ItemOutcome]:
        """Each item's outcome, in order: one without a snapshot is quarantined undecided, the others as
        `decide` says."""
        return [
            self.failed(item, snapshot)
            if isinstance(snapshot, Quarantine)
            else self.decided(item, decide(snapshot))
            for item, snapshot in snapshots
        ]

    def decided(
        self, source: SourceItem, decision: CompanyChange | UserChange | Skip | Quarantine
    ) -> ItemOutcome:
        if isinstance(decision, Quarantine):
            return self.failed(source, decision)
        if source.quarantine_id is not None:  # it applies now: it leaves the quarantine
            self._released.append(source.quarantine_id)
        entity = source.item.talent_id
        if isinstance(decision, Skip):
            return ItemOutcome(self.stage, entity, ItemResult.SKIPPED, stale=decision.stale)
        return ItemOutcome(self.stage, entity, ItemResult.APPLIED, change=decision.change)

    def failed(self, source: SourceItem, quarantine: Quarantine) -> ItemOutcome:
        attempts = source.attempts + 1
        retry_at = None
        if quarantine.code is SyncErrorCode.COMPANY_NOT_FOUND:
            # The consumer defers it with its back-off; an operator's replay keeps a deferred item deferred.
            retry_at = self.options.retry_at(attempts) if self.options.retry_at else source.deferred_until
        entity = source.item.talent_id
        self._quarantine.append(
            QuarantineEntry(
                entry_id=source.quarantine_id or uuid.uuid4(),
                run_id=self.options.run_id,
                stage=self.stage.value,
                external_id=entity,
                error_code=quarantine.code.value,
                payload=source.item.payload,
                attempt_count=attempts,
                next_attempt_at=retry_at,
                reason=quarantine.reason,
            )
        )
        return ItemOutcome(
            self.stage,
            entity,
            ItemResult.FAILED,
            error=quarantine.code,
            retry_at=retry_at,
            reason=quarantine.reason,
        )

    def forget_tombstoned(self, snapshots: Sequence[TenantSnapshot | UserSnapshot]) -> None:
        """A tombstone (a deletion without a version) is the entity's last record: no snapshot of it that any
        quarantine holds may apply after it (an operator's replay would bring the deleted entity back)."""
        tombstoned = sorted({_entity(s) for s in snapshots if s.is_deleted and s.version is None})
        if tombstoned and self.writes:
            self.tx.discard_quarantined(self.stage.value, tombstoned)

    def flush_quarantine(self) -> None:
        if not self.writes:
            return
        if self._quarantine:
            self.tx.quarantine(self._quarantine)
        if self._released:
            self.tx.release_quarantined(self._released)
        self._quarantine, self._released = [], []


def _entity(snapshot: TenantSnapshot | UserSnapshot) -> UUID:
    return snapshot.tenant_id if isinstance(snapshot, TenantSnapshot) else snapshot.user_id


def stand_in(talent_id: UUID) -> UUID:
    """The id a dry run gives an entity it would have created."""
    return uuid.uuid5(uuid.NAMESPACE_OID, str(talent_id))


def new_id(talent_id: UUID, dry_run: bool = False) -> UUID:
    """The id of an entity created now: a fresh one, or in a dry run its stand-in (its later pages and the
    phones it would hold name it by that)."""
    return stand_in(talent_id) if dry_run else uuid.uuid4()

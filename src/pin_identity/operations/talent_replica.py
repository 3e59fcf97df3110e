"""Applying Talent snapshots to the replica: one use case for the continuous consumer and the import.

A batch is applied in one transaction with a handful of statements, whatever its size; the outcome is per
item. Tenants go first, so that a user and its tenant in one batch apply in the right order. An entity that
occurs several times in a batch is applied in rounds (its first occurrence in round one, its second in round
two, ...) so that each round touches an entity once and every rule sees the state its predecessors left. A
unique conflict the reads could not foresee (a concurrent writer took the phone) rolls the round back to its
savepoint and replays it item by item, so a poison item never fails its batch.

The path of an item, in the order it runs (each step calls only the ones below it, none calls back):
- adapters/talent_wire.py read it once where it came in (a topic record, an API page, a quarantine row read
  back), into a TalentItem: its typed snapshot, or an InvalidSnapshot naming what is wrong with it.
- here: apply_snapshots splits the batch into stages and rounds, each round in a savepoint.
- talent_decisions.py reads what the replica holds around the round (port ReplicaReads) and has the domain
  decide each item, in order. domain/talent.py decides, and is where every quarantine reason is given:
  snapshot_of (no snapshot: IDENTITY_SYNC_INVALID_PAYLOAD, with the edge's reason), decide_tenant (an unknown
  or changed company type), decide_user (no tenant yet, the phone another user's); and conflicted (a write
  that met a unique constraint), which _apply_round below asks when an item alone in its round fails.
- talent_writes.py writes what the decisions changed: companies, users, default roles, events (ReplicaWrites).
- talent_round.py turns each decision into the item's outcome and writes the quarantine (QuarantineRows): a
  row per Quarantine decision with its code and reason, and when an item without its tenant is tried again
  (ApplyOptions.retry_at: the consumer's back-off, jobs/talent_sync.py).
- adapters/postgres/replica_store.py (its statements in replica_store.sql) implements the ports.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from pin_identity.domain.errors import NotFoundError, StoreConflictError
from pin_identity.domain.talent import Decision, ImportStage, ItemResult, conflicted, newest_snapshots
from pin_identity.observability.logging import get_logger
from pin_identity.operations.context import Context
from pin_identity.operations.ports.replica import ReplicaTransaction, ReplicaTransactions, SourceItem
from pin_identity.operations.talent_decisions import decide_tenants, decide_users
from pin_identity.operations.talent_round import ApplyOptions, BatchOutcome, ItemOutcome, settle
from pin_identity.operations.talent_writes import write_tenants, write_users

__all__ = [
    "ApplyOptions",
    "BatchOutcome",
    "ItemOutcome",
    "Replayed",
    "apply_snapshots",
    "replay_quarantined",
    "retry_deferred",
]

log = get_logger("talent-replica")


def apply_snapshots(
    tx: ReplicaTransaction, items: Sequence[SourceItem], ctx: Context, options: ApplyOptions
) -> BatchOutcome:
    """Apply a batch inside `tx` (the caller commits): its tenants, then its users."""
    batch = BatchOutcome(correlation_id=ctx.correlation_id)
    for stage in ImportStage:
        staged = [item for item in items if item.item.stage is stage]
        if not staged:
            continue
        if not options.dry_run:
            # Every id of the stage, once and in order, before any savepoint: a rollback to a savepoint
            # releases the locks taken inside it, and the item-by-item replay must not take them again out
            # of order.
            ids = sorted({entity for item in staged if (entity := item.item.talent_id) is not None})
            tx.lock_talent_ids(stage, ids)
        for round_items in _rounds(staged):
            batch.outcomes.extend(_apply_round(_Round(tx, stage, ctx, options), round_items))
    return batch


def _rounds(items: Sequence[SourceItem]) -> list[list[SourceItem]]:
    rounds: list[list[SourceItem]] = []
    seen: dict[UUID | None, int] = defaultdict(int)
    for item in items:
        entity = item.item.talent_id
        occurrence = seen[entity] if entity is not None else 0
        seen[entity] += 1
        while len(rounds) <= occurrence:
            rounds.append([])
        rounds[occurrence].append(item)
    return rounds


@dataclass(frozen=True)
class _Round:
    """The transaction, the stage and the options a round is applied with."""

    tx: ReplicaTransaction
    stage: ImportStage
    ctx: Context
    options: ApplyOptions


def _apply_round(this_round: _Round, items: list[SourceItem]) -> list[ItemOutcome]:
    """The round decided, written and settled in a savepoint; after a conflict, item by item."""
    tx, stage, options = this_round.tx, this_round.stage, this_round.options
    try:
        with tx.savepoint():
            decisions = _decide_and_write(this_round, items)
            return settle(tx, stage, options, list(zip(items, decisions, strict=True)))
    except StoreConflictError as conflict:
        if len(items) > 1:
            return [out for item in items for out in _apply_round(this_round, [item])]
        # Alone in its round, the item's write is what the constraint refused: the round is rolled back.
        return settle(tx, stage, options, [(items[0], conflicted(conflict))])


def _decide_and_write(this_round: _Round, items: list[SourceItem]) -> Sequence[Decision]:
    """Each item's decision, in order, once the round's changes are written."""
    tx, ctx, options = this_round.tx, this_round.ctx, this_round.options
    if this_round.stage is ImportStage.TENANTS:
        tenants = decide_tenants(tx, options, items)
        write_tenants(tx, ctx, options, tenants)
        return tenants.decisions
    users = decide_users(tx, options, items)
    write_users(tx, ctx, options, users)
    return users.decisions


@dataclass(frozen=True)
class Replayed:
    """What a replay of the quarantine came to; `without_snapshot`: rows it could not apply, having kept no
    snapshot to apply (pruned past retention): they stay, for the operator to see."""

    batch: BatchOutcome
    without_snapshot: int


def replay_quarantined(
    transactions: ReplicaTransactions, ctx: Context, *, run_id: UUID | None, item_ids: Sequence[UUID] | None
) -> Replayed:
    """The runbook's replay after the operator fixed the cause: the chosen items (all when None) of a run are
    applied again; one that applies leaves the quarantine, one that fails again stays, with its new reason."""
    with transactions() as tx:
        quarantined = tx.quarantined_for_replay(run_id, item_ids)
        found = {item.quarantine_id for item in quarantined.items} | set(quarantined.without_snapshot)
        missing = sorted(set(item_ids or []) - found)
        if missing:  # a mistyped id is an error, not "applied: 0"
            where = f"import run {run_id}" if run_id else "the talent-sync consumer"
            raise NotFoundError(f"not in the quarantine of {where}: {', '.join(map(str, missing))}")
        batch = apply_snapshots(tx, quarantined.items, ctx, ApplyOptions(run_id=run_id))
        tx.commit()
    if quarantined.without_snapshot:
        log.warning(
            "quarantine-item-not-replayable",
            run_id=str(run_id) if run_id else None,
            items=[str(item) for item in quarantined.without_snapshot],
            reason="its snapshot was pruned past retention (or never stored)",
        )
    return Replayed(batch, len(quarantined.without_snapshot))


def retry_deferred(tx: ReplicaTransaction, ctx: Context, options: ApplyOptions, limit: int) -> BatchOutcome:
    """The consumer's deferred items that are due, applied again inside `tx` (the caller commits).

    An entity's deferred snapshots come back together, and only what the version guard would have kept had
    they arrived after their tenant is applied: the newest, and a deletion newer than it. The others leave the
    quarantine as stale; applied in version order, each would have published a snapshot Talent had already
    replaced (a late duplicate of V+1 after V+5)."""
    return retry_due(tx, tx.due_quarantined(ctx.now, limit), ctx, options)


def retry_due(
    tx: ReplicaTransaction, due: Sequence[SourceItem], ctx: Context, options: ApplyOptions
) -> BatchOutcome:
    """retry_deferred for the items `tx.due_quarantined` found due (the caller may trace only a retry that
    has something to do)."""
    kept, superseded = _newest_of_each(due)
    tx.release_quarantined([item.quarantine_id for item in superseded if item.quarantine_id is not None])
    batch = apply_snapshots(tx, kept, ctx, options)
    batch.outcomes.extend(
        ItemOutcome(item.item.stage, item.item.talent_id, ItemResult.SKIPPED, stale=True)
        for item in superseded
    )
    return batch


def _newest_of_each(items: Sequence[SourceItem]) -> tuple[list[SourceItem], list[SourceItem]]:
    """Of each entity's items: those kept (the newest live snapshot, then a deletion newer than it; in
    version order) and those superseded by them."""
    by_entity: dict[tuple[ImportStage, UUID | None], list[SourceItem]] = defaultdict(list)
    for item in items:
        by_entity[(item.item.stage, item.item.talent_id)].append(item)
    kept: list[SourceItem] = []
    superseded: list[SourceItem] = []
    for group in by_entity.values():
        newest = newest_snapshots([item.item.snapshot for item in group])
        kept.extend(item for index, item in enumerate(group) if index in newest)
        superseded.extend(item for index, item in enumerate(group) if index not in newest)
    return kept, superseded

"""Applying Talent snapshots to the replica: one use case for the continuous consumer and the import.

A batch is applied in one transaction with a handful of statements, whatever its size; the outcome is per
item. An entity that occurs several times in a batch is applied in rounds (its first occurrence in round one,
its second in round two, ...) so that each round touches an entity once and every rule sees the state its
predecessors left. A unique conflict the reads could not foresee (a concurrent writer took the phone) rolls
the round back to its savepoint and replays it item by item, so a poison item never fails its batch.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar
from uuid import UUID

from pin_identity.domain import events
from pin_identity.domain.errors import NotFoundError
from pin_identity.domain.events import CompanyState, OutboxMessage, UserState
from pin_identity.domain.model import AccessChangeReason, CompanyStatus
from pin_identity.domain.talent import (
    Change,
    CompanyChange,
    ImportStage,
    InvalidSnapshotError,
    ItemResult,
    Quarantine,
    RawSnapshot,
    Skip,
    SyncErrorCode,
    TenantSnapshot,
    UserChange,
    UserContext,
    UserSnapshot,
    decide_tenant,
    decide_user,
    external_id,
    parse_tenant,
    parse_user,
)
from pin_identity.operations.identity import Context, notify_access_changed
from pin_identity.operations.ports import (
    DefaultGrant,
    DryRunMemory,
    QuarantineEntry,
    ReplicaTransaction,
    ReplicaTransactions,
    RoleRecord,
    StoreConflictError,
)

_Snapshot = TypeVar("_Snapshot", TenantSnapshot, UserSnapshot)


@dataclass(frozen=True)
class SourceItem:
    """A snapshot to apply; a re-applied quarantine row carries its id and how often it was tried."""

    raw: RawSnapshot
    quarantine_id: UUID | None = None
    attempts: int = 0


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


def apply_snapshots(
    tx: ReplicaTransaction,
    stage: ImportStage,
    items: Sequence[SourceItem],
    ctx: Context,
    options: ApplyOptions,
) -> BatchOutcome:
    """Apply a batch of one stage inside `tx` (the caller commits)."""
    batch = BatchOutcome()
    if not options.dry_run:
        # Every id of the batch, once and in order, before any savepoint: a rollback to a savepoint releases
        # the locks taken inside it, and the item-by-item replay must not take them again out of order.
        ids = sorted({entity for item in items if (entity := external_id(item.raw, stage)) is not None})
        tx.lock_talent_ids(stage, ids)
    for round_items in _rounds(stage, items):
        batch.outcomes.extend(_apply_round(tx, stage, round_items, ctx, options))
    return batch


def _rounds(stage: ImportStage, items: Sequence[SourceItem]) -> list[list[SourceItem]]:
    rounds: list[list[SourceItem]] = []
    seen: dict[UUID | None, int] = defaultdict(int)
    for item in items:
        entity = external_id(item.raw, stage)
        occurrence = seen[entity] if entity is not None else 0
        seen[entity] += 1
        while len(rounds) <= occurrence:
            rounds.append([])
        rounds[occurrence].append(item)
    return rounds


def _apply_round(
    tx: ReplicaTransaction, stage: ImportStage, items: list[SourceItem], ctx: Context, options: ApplyOptions
) -> list[ItemOutcome]:
    try:
        with tx.savepoint():
            return _RoundWriter(tx, stage, ctx, options).apply(items)
    except StoreConflictError as conflict:
        if len(items) > 1:
            return [out for item in items for out in _apply_round(tx, stage, [item], ctx, options)]
        code = SyncErrorCode.PHONE_CONFLICT if conflict.field == "phone" else SyncErrorCode.INVALID_PAYLOAD
        writer = _RoundWriter(tx, stage, ctx, options)
        outcome = writer.failed(items[0], Quarantine(code, str(conflict)))
        writer.flush_quarantine()
        return [outcome]


class _RoundWriter:
    """Decides every item of one round against the replica, then writes the round in bulk."""

    def __init__(self, tx: ReplicaTransaction, stage: ImportStage, ctx: Context, options: ApplyOptions):
        self._tx, self._stage, self._ctx, self._options = tx, stage, ctx, options
        self._quarantine: list[QuarantineEntry] = []
        self._released: list[UUID] = []

    def apply(self, items: list[SourceItem]) -> list[ItemOutcome]:
        if self._stage is ImportStage.TENANTS:
            outcomes = self._apply_tenants(items)
        else:
            outcomes = self._apply_users(items)
        self.flush_quarantine()
        return outcomes

    # ------------------------------------------------------------ tenants

    def _apply_tenants(self, items: list[SourceItem]) -> list[ItemOutcome]:
        parsed = [(item, _parse(parse_tenant, item.raw)) for item in items]
        tenant_ids = sorted({p.tenant_id for _, p in parsed if isinstance(p, TenantSnapshot)})
        if not self._options.dry_run:
            self._tx.lock_talent_ids(self._stage, tenant_ids)
        current = self._tx.companies_by_tenant(tenant_ids)
        deleted = self._tx.deleted_versions(self._stage, [t for t in tenant_ids if t not in current])
        outcomes, changes, absent_deletions = [], [], {}
        for item, snapshot in parsed:
            if isinstance(snapshot, Quarantine):
                outcomes.append(self.failed(item, snapshot))
                continue
            known = current.get(snapshot.tenant_id)
            guard = deleted.get(snapshot.tenant_id)
            decision = decide_tenant(snapshot, known, uuid.uuid4, deleted_version=guard)
            outcomes.append(self._outcome(item, snapshot.tenant_id, decision))
            if isinstance(decision, CompanyChange):
                changes.append(decision)
            elif known is None and snapshot.is_deleted and snapshot.version is not None:
                absent_deletions[snapshot.tenant_id] = snapshot.version
        if not self._options.dry_run:
            self._write_companies(changes)
            self._tx.remember_deletions(self._stage, absent_deletions)
        elif self._options.memory is not None:
            present = [c.state.external_talent_tenant_id for c in changes if c.state.status != "Blocked"]
            self._options.memory.remember([t for t in present if t is not None], {})
        return outcomes

    def _write_companies(self, changes: list[CompanyChange]) -> None:
        followed = sorted({c.state.company_id for c in changes if c.change in _ACCESS_CHANGING})
        # Their managers are locked before the companies change: a user round locks its users, then shares
        # its companies, so taking the managers' locks only after the update could wait on each other.
        self._tx.lock_managers(followed)
        created = [c.state for c in changes if c.change is Change.CREATED]
        updated = [c.state for c in changes if c.change is not Change.CREATED]
        self._tx.save_companies(created, updated, self._ctx.now)
        self._tx.add_events([self._company_event(c.state) for c in changes])
        if followed:
            _ManagersFollow(self._tx, self._ctx, changes).apply()

    def _company_event(self, company: CompanyState) -> OutboxMessage:
        return events.company_upserted(
            company, correlation_id=self._ctx.correlation_id, occurred_at=self._ctx.now
        )

    # ------------------------------------------------------------ users

    def _apply_users(self, items: list[SourceItem]) -> list[ItemOutcome]:
        parsed = [(item, _parse(parse_user, item.raw)) for item in items]
        snapshots = [p for _, p in parsed if isinstance(p, UserSnapshot)]
        replica = self._user_replica(snapshots)
        outcomes: list[ItemOutcome] = []
        changes: list[UserChange] = []
        absent_deletions: list[UserSnapshot] = []
        for item, snapshot in parsed:
            if isinstance(snapshot, Quarantine):
                outcomes.append(self.failed(item, snapshot))
                continue
            context = replica.context(snapshot)
            decision = decide_user(snapshot, context, uuid.uuid4)
            outcomes.append(self._outcome(item, snapshot.user_id, decision))
            if isinstance(decision, UserChange):
                replica.record(decision)
                changes.append(decision)
            elif decision == Skip(stale=False) and context.current is None:
                absent_deletions.append(snapshot)
        if self._options.dry_run:
            self._remember_phones(changes)
        else:
            _UserWrite(self._tx, self._ctx, changes, replica.blocked_companies).apply()
            self._forget_absent(absent_deletions)
        return outcomes

    def _user_replica(self, snapshots: list[UserSnapshot]) -> _UserReplica:
        user_ids = sorted({s.user_id for s in snapshots})
        dry_run = self._options.dry_run
        if not dry_run:
            self._tx.lock_talent_ids(self._stage, user_ids)
        users = self._tx.users_by_talent_id(user_ids, lock=not dry_run)
        tenant_ids = sorted({s.tenant_id for s in snapshots if s.tenant_id is not None})
        known = self._tx.companies_by_tenant(tenant_ids, shared=not dry_run)
        companies = {tid: c.company_id for tid, c in known.items()}
        blocked = {c.company_id for c in known.values() if c.status == CompanyStatus.BLOCKED.value}
        phones = sorted({s.phone for s in snapshots if s.phone})
        owners = self._tx.phone_owners(phones)
        deleted = self._tx.deleted_versions(self._stage, [u for u in user_ids if u not in users])
        memory = self._options.memory
        if memory is not None:
            for tenant_id in memory.tenants(tenant_ids):
                companies.setdefault(tenant_id, _stand_in(tenant_id))
            for phone, talent_user in memory.phones(phones).items():
                owners.setdefault(phone, _stand_in(talent_user))
        replica = _UserReplica(users, companies, owners, deleted)
        replica.blocked_companies = blocked
        return replica

    def _forget_absent(self, deletions: list[UserSnapshot]) -> None:
        """A deletion of a user the replica never had must keep older snapshots from creating it: a versioned
        one is remembered by its version (the guard then skips them, deferred ones included); a tombstone has
        no version but is the key's last record, so the deferred items of that user are dropped."""
        versions: dict[UUID, int] = {}
        for deletion in deletions:
            if deletion.version is not None:
                versions[deletion.user_id] = max(deletion.version, versions.get(deletion.user_id, 0))
        self._tx.remember_deletions(self._stage, versions)
        tombstoned = [d.user_id for d in deletions if d.version is None]
        if tombstoned:
            self._tx.discard_deferred(self._stage, tombstoned)

    def _remember_phones(self, changes: list[UserChange]) -> None:
        if self._options.memory is not None:
            held = {
                c.state.phone: c.state.external_talent_user_id
                for c in changes
                if c.change is not Change.BLOCKED
            }
            self._options.memory.remember(
                [], {phone: user for phone, user in held.items() if user is not None}
            )

    # ------------------------------------------------------------ outcomes and quarantine

    def _outcome(
        self, item: SourceItem, entity: UUID, decision: CompanyChange | UserChange | Skip | Quarantine
    ) -> ItemOutcome:
        if isinstance(decision, Quarantine):
            return self.failed(item, decision)
        self._release(item)
        if isinstance(decision, Skip):
            return ItemOutcome(self._stage, entity, ItemResult.SKIPPED, stale=decision.stale)
        return ItemOutcome(self._stage, entity, ItemResult.APPLIED, change=decision.change)

    def failed(self, item: SourceItem, quarantine: Quarantine) -> ItemOutcome:
        entity = external_id(item.raw, self._stage)
        attempts = item.attempts + 1
        retry_at = None
        if quarantine.code is SyncErrorCode.COMPANY_NOT_FOUND and self._options.retry_at is not None:
            retry_at = self._options.retry_at(attempts)
        self._quarantine.append(
            QuarantineEntry(
                entry_id=item.quarantine_id or uuid.uuid4(),
                run_id=self._options.run_id,
                stage=self._stage.value,
                external_id=entity,
                error_code=quarantine.code.value,
                payload=item.raw.payload,
                attempt_count=attempts,
                next_attempt_at=retry_at,
                reason=quarantine.reason,
            )
        )
        return ItemOutcome(
            self._stage,
            entity,
            ItemResult.FAILED,
            error=quarantine.code,
            retry_at=retry_at,
            reason=quarantine.reason,
        )

    def _release(self, item: SourceItem) -> None:
        if item.quarantine_id is not None:
            self._released.append(item.quarantine_id)

    def flush_quarantine(self) -> None:
        if self._options.dry_run:
            return
        if self._quarantine:
            self._tx.quarantine(self._quarantine)
        if self._released:
            self._tx.release_quarantined(self._released)
        self._quarantine, self._released = [], []


def _parse(parse: Callable[[RawSnapshot], _Snapshot], raw: RawSnapshot) -> _Snapshot | Quarantine:
    try:
        return parse(raw)
    except InvalidSnapshotError as exc:
        return Quarantine(SyncErrorCode.INVALID_PAYLOAD, str(exc))


def _stand_in(talent_id: UUID) -> UUID:
    """The id a dry run gives an entity it would have created."""
    return uuid.uuid5(uuid.NAMESPACE_OID, str(talent_id))


class _UserReplica:
    """The replica around a round of users, kept current as the round's decisions are taken."""

    def __init__(
        self,
        users: dict[UUID, UserState],
        companies: dict[UUID, UUID],
        owners: dict[str, UUID],
        deleted: dict[UUID, int],
    ):
        self._users, self._companies, self._owners, self._deleted = users, companies, owners, deleted
        self.blocked_companies: set[UUID] = set()

    def context(self, snapshot: UserSnapshot) -> UserContext:
        company = self._companies.get(snapshot.tenant_id) if snapshot.tenant_id is not None else None
        owner = self._owners.get(snapshot.phone)
        if owner == _stand_in(snapshot.user_id):
            owner = None  # a dry run's earlier page gave this very user the phone
        return UserContext(
            self._users.get(snapshot.user_id), company, owner, self._deleted.get(snapshot.user_id)
        )

    def record(self, decision: UserChange) -> None:
        state = decision.state
        previous = self._users.get(state.external_talent_user_id or state.user_id)
        if previous is not None and self._owners.get(previous.phone) == state.user_id:
            del self._owners[previous.phone]
        self._owners[state.phone] = state.user_id
        if state.external_talent_user_id is not None:
            self._users[state.external_talent_user_id] = state


_GRANTING = (Change.CREATED, Change.RESTORED, Change.MOVED)
_ACCESS_CHANGING = (Change.BLOCKED, Change.RESTORED)


class _ManagersFollow:
    """A Talent manager holds its organization's default role only while its company is not Blocked: blocking
    a company revokes its managers' default roles (RoleRevoked), restoring it grants them back
    (RoleAssigned)."""

    def __init__(self, tx: ReplicaTransaction, ctx: Context, changes: list[CompanyChange]):
        self._tx, self._ctx = tx, ctx
        self._blocked = {c.state.company_id for c in changes if c.change is Change.BLOCKED}
        self._restored = {c.state.company_id for c in changes if c.change is Change.RESTORED}

    def apply(self) -> None:
        role = self._tx.default_role()
        # Again after the update, which waited for every user round that had read these companies: a manager
        # such a round moved in meanwhile is among them now.
        managers = self._tx.lock_managers(sorted(self._blocked | self._restored))
        leaving = [user for user, company in managers.items() if company in self._blocked]
        revoked = sorted({user for user, _ in self._tx.revoke_user_assignments(leaving, role.role_id)})
        returning = [user for user, company in managers.items() if company in self._restored]
        grants = [
            DefaultGrant(uuid.uuid4(), user, company)
            for user, company in self._tx.managers_without_default_role(returning, role.role_id)
        ]
        self._tx.grant_default_role(role, grants)
        granted = sorted(g.user_id for g in grants)
        for users, reason in (
            (revoked, AccessChangeReason.ROLE_REVOKED),
            (granted, AccessChangeReason.ROLE_ASSIGNED),
        ):
            notify_access_changed(self._tx, self._ctx, users, reason=reason, changed_role_id=role.role_id)


class _UserWrite:
    """The bulk writes and the events of one round of user changes."""

    def __init__(
        self, tx: ReplicaTransaction, ctx: Context, changes: list[UserChange], blocked_companies: set[UUID]
    ):
        self._tx, self._ctx, self._changes = tx, ctx, changes
        # Created in, restored into or moved to a Blocked company: no default role (see _ManagersFollow).
        self._granted = {
            c.state.user_id
            for c in changes
            if c.change in _GRANTING
            and c.state.company_id is not None
            and c.state.company_id not in blocked_companies
        }

    def apply(self) -> None:
        if not self._changes:
            return
        role = self._tx.default_role()
        revoked = self._revoke(role)
        created = [c.state for c in self._changes if c.change is Change.CREATED]
        updated = [c.state for c in self._changes if c.change is not Change.CREATED]
        self._tx.save_users(created, updated, self._ctx.now)
        grants = [
            DefaultGrant(uuid.uuid4(), c.state.user_id, c.state.company_id)
            for c in self._changes
            if c.state.user_id in self._granted and c.state.company_id is not None
        ]
        self._tx.grant_default_role(role, grants)
        self._tx.add_events(self._events(role, revoked))

    def _revoke(self, role: RoleRecord) -> dict[UUID, list[UUID]]:
        blocked = [c.state.user_id for c in self._changes if c.change is Change.BLOCKED]
        moved = [c.state.user_id for c in self._changes if c.change is Change.MOVED]
        revoked: dict[UUID, list[UUID]] = defaultdict(list)
        pairs = self._tx.revoke_user_assignments(blocked, None) if blocked else []
        if moved:
            pairs += self._tx.revoke_user_assignments(moved, role.role_id)
        for user_id, role_id in pairs:
            if role_id not in revoked[user_id]:
                revoked[user_id].append(role_id)
        return revoked

    def _events(self, role: RoleRecord, revoked: dict[UUID, list[UUID]]) -> list[OutboxMessage]:
        touched = [
            c.state.user_id
            for c in self._changes
            if c.state.user_id in self._granted or revoked.get(c.state.user_id)
        ]
        snapshots = {s.user_id: s for s in self._tx.access_snapshots(touched)} if touched else {}
        versions = self._tx.access_versions(touched) if touched else {}
        correlation_id, now = self._ctx.correlation_id, self._ctx.now
        messages = []
        for change in self._changes:
            user_id = change.state.user_id
            messages.append(
                events.user_upserted(change.state, correlation_id=correlation_id, occurred_at=now)
            )
            granted = user_id in self._granted
            for reason, role_id in _access_reasons(granted, role, revoked.get(user_id, [])):
                messages.append(
                    events.user_access_changed(
                        snapshots[user_id],
                        reason=reason,
                        version=versions[user_id],
                        changed_role_id=role_id,
                        correlation_id=correlation_id,
                        occurred_at=now,
                    )
                )
        return messages


def _access_reasons(
    granted: bool, role: RoleRecord, revoked_roles: Iterable[UUID]
) -> list[tuple[AccessChangeReason, UUID]]:
    if granted:
        return [(AccessChangeReason.ROLE_ASSIGNED, role.role_id)]
    return [(AccessChangeReason.ROLE_REVOKED, role_id) for role_id in revoked_roles]


def quarantined_items(entries: Sequence[QuarantineEntry], stage: ImportStage) -> list[SourceItem]:
    """Quarantine rows of one stage as items to apply again (each keeps its row id and attempt count)."""
    return [
        SourceItem(
            RawSnapshot(str(e.external_id) if e.external_id else None, e.payload),
            quarantine_id=e.entry_id,
            attempts=e.attempt_count,
        )
        for e in entries
        if e.stage == stage.value
    ]


def replay_quarantined(
    transactions: ReplicaTransactions, ctx: Context, *, run_id: UUID | None, item_ids: Sequence[UUID] | None
) -> BatchOutcome:
    """The runbook's replay after the operator fixed the cause: the chosen items (all when None) of a run are
    applied again; one that applies leaves the quarantine, one that fails again stays, with its new reason."""
    batch = BatchOutcome()
    with transactions() as tx:
        entries = tx.quarantined_for_replay(run_id, item_ids)
        missing = sorted(set(item_ids or []) - {e.entry_id for e in entries})
        if missing:  # a mistyped id is an error, not "applied: 0"
            where = f"import run {run_id}" if run_id else "the talent-sync consumer"
            raise NotFoundError(f"not in the quarantine of {where}: {', '.join(map(str, missing))}")
        for stage in ImportStage:
            items = quarantined_items(entries, stage)
            if items:
                batch.outcomes += apply_snapshots(tx, stage, items, ctx, ApplyOptions(run_id=run_id)).outcomes
        tx.commit()
    return batch

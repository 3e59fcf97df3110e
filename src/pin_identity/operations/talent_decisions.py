"""What each item of a round comes to (see talent_replica): the facts the replica holds around the round's
items, read in bulk, and the domain's decision (domain/talent.py) taken for each item in order. This is the
one place the use case asks the domain to decide: an item is quarantined, and for which reason, as
snapshot_of, decide_tenant or decide_user say here. Nothing here writes; talent_writes writes what these
decisions changed, talent_round what the items came to.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from uuid import UUID

from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.model import CompanyStatus
from pin_identity.domain.talent import (
    CompanyChange,
    ImportStage,
    Quarantine,
    Skip,
    TenantDecision,
    TenantSnapshot,
    UserChange,
    UserContext,
    UserDecision,
    UserSnapshot,
    decide_tenant,
    decide_user,
    snapshot_of,
)
from pin_identity.operations.ports.replica import DryRunMemory, ReplicaReads, SourceItem
from pin_identity.operations.talent_round import ApplyOptions


def stand_in(talent_id: UUID) -> UUID:
    """The id a dry run gives an entity it would have created."""
    return uuid.uuid5(uuid.NAMESPACE_OID, str(talent_id))


def new_id(talent_id: UUID, dry_run: bool = False) -> UUID:
    """The id of an entity created now: a fresh one, or in a dry run its stand-in (its later pages and the
    phones it would hold name it by that)."""
    return stand_in(talent_id) if dry_run else uuid.uuid4()


# ---------------------------------------------------------------- tenants


@dataclass
class TenantsDecided:
    """A round of tenants decided: each item's decision (in the items' order), the changes to write, and the
    deletions of tenants the replica lacks (tenant -> the version that deleted it), to remember."""

    decisions: list[TenantDecision] = field(default_factory=list)
    changes: list[CompanyChange] = field(default_factory=list)
    absent_deletions: dict[UUID, int] = field(default_factory=dict)


@dataclass
class _TenantReplica:
    """The replica around a round of tenants: their companies, and deletions seen while one was absent."""

    companies: dict[UUID, CompanyState]
    deleted: dict[UUID, int]


def decide_tenants(tx: ReplicaReads, options: ApplyOptions, items: Sequence[SourceItem]) -> TenantsDecided:
    """Every tenant of the round decided against the replica; one without a snapshot is quarantined
    undecided."""
    snapshots = [snapshot_of(item.item, TenantSnapshot) for item in items]
    replica = _read_tenants(tx, options, [s for s in snapshots if isinstance(s, TenantSnapshot)])
    decided = TenantsDecided()
    for snapshot in snapshots:
        if isinstance(snapshot, Quarantine):
            decided.decisions.append(snapshot)
        else:
            decided.decisions.append(_decide_tenant(replica, decided, options.dry_run, snapshot))
    return decided


def _read_tenants(tx: ReplicaReads, options: ApplyOptions, snapshots: list[TenantSnapshot]) -> _TenantReplica:
    """The round's companies; a dry run's own earlier decisions over the replica's."""
    tenant_ids = sorted({s.tenant_id for s in snapshots})
    companies = tx.companies_by_tenant(tenant_ids)
    if options.memory is not None:
        companies.update(options.memory.companies(tenant_ids))
    absent = [t for t in tenant_ids if t not in companies]
    return _TenantReplica(companies, tx.deleted_versions(ImportStage.TENANTS, absent))


def _decide_tenant(
    replica: _TenantReplica, decided: TenantsDecided, dry_run: bool, snapshot: TenantSnapshot
) -> TenantDecision:
    known = replica.companies.get(snapshot.tenant_id)
    guard = replica.deleted.get(snapshot.tenant_id)
    created_as = partial(new_id, snapshot.tenant_id, dry_run)
    decision = decide_tenant(snapshot, known, created_as, deleted_version=guard)
    if isinstance(decision, CompanyChange):
        decided.changes.append(decision)
    elif known is None and snapshot.is_deleted and snapshot.version is not None:
        decided.absent_deletions[snapshot.tenant_id] = snapshot.version
    return decision


# ---------------------------------------------------------------- users


@dataclass
class UsersDecided:
    """A round of users decided: each item's decision (in the items' order), the changes to write, the
    versioned deletions of users the replica lacks (user -> version, to remember), and which of the round's
    companies are Blocked (a user joining one gets no default role)."""

    decisions: list[UserDecision] = field(default_factory=list)
    changes: list[UserChange] = field(default_factory=list)
    absent_deletions: dict[UUID, int] = field(default_factory=dict)
    blocked_companies: set[UUID] = field(default_factory=set)


def decide_users(tx: ReplicaReads, options: ApplyOptions, items: Sequence[SourceItem]) -> UsersDecided:
    """Every user of the round decided against the replica, in order, each seeing the phones its predecessors
    took or freed; one without a snapshot is quarantined undecided."""
    snapshots = [snapshot_of(item.item, UserSnapshot) for item in items]
    replica = _UserReplica.read(tx, options, [s for s in snapshots if isinstance(s, UserSnapshot)])
    decided = UsersDecided(blocked_companies=replica.blocked_companies)
    for snapshot in snapshots:
        if isinstance(snapshot, Quarantine):
            decided.decisions.append(snapshot)
        else:
            decided.decisions.append(_decide_user(replica, decided, options.dry_run, snapshot))
    return decided


def _decide_user(
    replica: _UserReplica, decided: UsersDecided, dry_run: bool, snapshot: UserSnapshot
) -> UserDecision:
    context = replica.context(snapshot)
    decision = decide_user(snapshot, context, partial(new_id, snapshot.user_id, dry_run))
    if isinstance(decision, UserChange):
        replica.record(decision)
        decided.changes.append(decision)
    elif decision == Skip(stale=False) and context.current is None and snapshot.version is not None:
        # A versioned deletion of a user the replica never had must keep older snapshots from creating it:
        # it is remembered by its version (the guard then skips them, deferred and quarantined ones
        # included). A tombstone has no version: it drops the user's quarantined snapshots instead
        # (talent_round.settle).
        known = decided.absent_deletions.get(snapshot.user_id, 0)
        decided.absent_deletions[snapshot.user_id] = max(snapshot.version, known)
    return decision


def _companies(known: dict[UUID, CompanyState]) -> tuple[dict[UUID, UUID], set[UUID]]:
    """The replica's company id of each tenant, and which of those companies are Blocked."""
    blocked = {c.company_id for c in known.values() if c.status == CompanyStatus.BLOCKED.value}
    return {tenant: c.company_id for tenant, c in known.items()}, blocked


def _add_dry_run(
    memory: DryRunMemory,
    wanted: tuple[list[UUID], list[UUID], list[str]],
    known: tuple[dict[UUID, UserState], dict[UUID, CompanyState], dict[str, UUID]],
) -> None:
    """Of the wanted users, tenants and phones, what a dry run's earlier pages would have written, over what
    the replica holds: its users and companies as they would be, and who would hold a phone."""
    user_ids, tenant_ids, phones = wanted
    users, companies, owners = known
    users.update(memory.users(user_ids))
    companies.update(memory.companies(tenant_ids))
    for phone, talent_user in memory.phones(phones).items():
        owners.setdefault(phone, stand_in(talent_user))


class _UserReplica:
    """The replica around a round of users, kept current as the round's decisions are taken."""

    def __init__(
        self,
        users: dict[UUID, UserState],
        companies: dict[UUID, UUID],
        owners: dict[str, UUID],
        absent_versions: tuple[dict[UUID, int], dict[UUID, int]],
        blocked_companies: set[UUID],
    ):
        """`absent_versions`: of users the replica lacks, the versions of their deletions seen and of their
        snapshots deferred until their tenant arrives."""
        self._users, self._companies, self._owners = users, companies, owners
        self._deleted, self._waiting = absent_versions
        self.blocked_companies = blocked_companies

    @classmethod
    def read(cls, tx: ReplicaReads, options: ApplyOptions, snapshots: list[UserSnapshot]) -> _UserReplica:
        """Users and deletions by Talent id, companies by tenant (shared: their writers wait), phone owners;
        a dry run adds what its earlier pages would have written."""
        writes = not options.dry_run
        user_ids = sorted({s.user_id for s in snapshots})
        users = tx.users_by_talent_id(user_ids, lock=writes)
        tenant_ids = sorted({s.tenant_id for s in snapshots if s.tenant_id is not None})
        known_companies = tx.companies_by_tenant(tenant_ids, shared=writes)
        phones = sorted({s.phone for s in snapshots if s.phone})
        owners = tx.phone_owners(phones)
        if options.memory is not None:
            known = (users, known_companies, owners)
            _add_dry_run(options.memory, (user_ids, tenant_ids, phones), known)
        companies, blocked = _companies(known_companies)
        absent = [u for u in user_ids if u not in users]
        deleted = tx.deleted_versions(ImportStage.USERS, absent)
        # Only the consumer defers (an import's barrier has every tenant in before its users).
        deferring = options.retry_at is not None
        waiting = tx.waiting_versions(ImportStage.USERS, absent) if deferring else {}
        return cls(users, companies, owners, (deleted, waiting), blocked)

    def context(self, snapshot: UserSnapshot) -> UserContext:
        company = self._companies.get(snapshot.tenant_id) if snapshot.tenant_id is not None else None
        owner = self._owners.get(snapshot.phone)
        # A dry run's earlier page may have given this very user the phone (uuid5 only where the phone has an
        # owner: computed for every manager it was 7% of the apply).
        if owner is not None and owner == stand_in(snapshot.user_id):
            owner = None
        user_id = snapshot.user_id
        return UserContext(
            self._users.get(user_id), company, owner, self._deleted.get(user_id), self._waiting.get(user_id)
        )

    def record(self, decision: UserChange) -> None:
        state = decision.state
        previous = self._users.get(state.external_talent_user_id or state.user_id)
        if previous is not None and self._owners.get(previous.phone) == state.user_id:
            del self._owners[previous.phone]
        self._owners[state.phone] = state.user_id
        if state.external_talent_user_id is not None:
            self._users[state.external_talent_user_id] = state

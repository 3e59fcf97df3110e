"""The tenant rules of a round: Talent's companies decided against the replica, written in bulk, and their
managers' default roles following a company that is blocked or restored."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from uuid import UUID

from pin_identity.domain import events
from pin_identity.domain.events import CompanyState
from pin_identity.domain.model import AccessChangeReason
from pin_identity.domain.talent import Change, CompanyChange, TenantDecision, TenantSnapshot, decide_tenant
from pin_identity.operations.identity_changes import notify_access_changed
from pin_identity.operations.ports.identity_records import RoleRecord
from pin_identity.operations.ports.replica import DefaultGrant, ReplicaTransaction, SourceItem
from pin_identity.operations.talent_round import ItemOutcome, Round, new_id

_ACCESS_CHANGING = (Change.BLOCKED, Change.RESTORED)


@dataclass
class _Replica:
    """The replica around a round of tenants: their companies, and deletions seen while one was absent."""

    companies: dict[UUID, CompanyState]
    deleted: dict[UUID, int]


@dataclass
class _Decided:
    changes: list[CompanyChange] = field(default_factory=list)
    absent_deletions: dict[UUID, int] = field(default_factory=dict)  # tenant -> the version that deleted it


def apply_tenants(this_round: Round, items: Sequence[SourceItem]) -> list[ItemOutcome]:
    """Decide every tenant of the round against the replica, then write the round in bulk."""
    snapshots = [(item, this_round.snapshot(item, TenantSnapshot)) for item in items]
    replica = _read_replica(this_round, [s for _, s in snapshots if isinstance(s, TenantSnapshot)])
    decided = _Decided()
    outcomes = this_round.outcomes(snapshots, partial(_decide, replica, decided, not this_round.writes))
    if this_round.writes:
        _write_companies(this_round, decided.changes)
        this_round.tx.remember_deletions(this_round.stage, decided.absent_deletions)
        this_round.forget_tombstoned([s for _, s in snapshots if isinstance(s, TenantSnapshot)])
    elif this_round.options.memory is not None:
        states = {c.state.external_talent_tenant_id: c.state for c in decided.changes}
        this_round.options.memory.remember(this_round.stage, _by_talent_id(states), {})
    return outcomes


def _by_talent_id(states: dict[UUID | None, CompanyState]) -> dict[UUID, CompanyState]:
    return {talent_id: state for talent_id, state in states.items() if talent_id is not None}


def _read_replica(this_round: Round, snapshots: list[TenantSnapshot]) -> _Replica:
    """The round's companies; a dry run's own earlier decisions over the replica's."""
    tenant_ids = sorted({s.tenant_id for s in snapshots})
    companies = this_round.tx.companies_by_tenant(tenant_ids)
    if this_round.options.memory is not None:
        companies.update(this_round.options.memory.companies(tenant_ids))
    absent = [t for t in tenant_ids if t not in companies]
    return _Replica(companies, this_round.tx.deleted_versions(this_round.stage, absent))


def _decide(replica: _Replica, decided: _Decided, dry_run: bool, snapshot: TenantSnapshot) -> TenantDecision:
    known = replica.companies.get(snapshot.tenant_id)
    guard = replica.deleted.get(snapshot.tenant_id)
    created_as = partial(new_id, snapshot.tenant_id, dry_run)
    decision = decide_tenant(snapshot, known, created_as, deleted_version=guard)
    if isinstance(decision, CompanyChange):
        decided.changes.append(decision)
    elif known is None and snapshot.is_deleted and snapshot.version is not None:
        decided.absent_deletions[snapshot.tenant_id] = snapshot.version
    return decision


def _write_companies(this_round: Round, changes: list[CompanyChange]) -> None:
    tx, ctx = this_round.tx, this_round.ctx
    followed = sorted({c.state.company_id for c in changes if c.change in _ACCESS_CHANGING})
    # Their managers are locked before the companies change: a user round locks its users, then shares
    # its companies, so taking the managers' locks only after the update could wait on each other.
    tx.lock_managers(followed)
    created = [c.state for c in changes if c.change is Change.CREATED]
    updated = [c.state for c in changes if c.change is not Change.CREATED]
    tx.save_companies(created, updated, ctx.now)
    # Users the consumer deferred until their tenant arrived go now, not at their next back-off.
    tenants = [c.state.external_talent_tenant_id for c in changes if c.state.external_talent_tenant_id]
    tx.wake_deferred(tenants, ctx.now)
    tx.add_events(
        [
            events.company_upserted(
                c.state, correlation_id=ctx.correlation_id, occurred_at=ctx.now, traceparent=ctx.traceparent
            )
            for c in changes
        ]
    )
    if followed:
        _managers_follow(this_round, changes)


def _managers_follow(this_round: Round, changes: list[CompanyChange]) -> None:
    """A Talent manager holds its organization's default role only while its company is not Blocked: blocking
    a company revokes its managers' default roles (RoleRevoked), restoring it grants them back
    (RoleAssigned)."""
    tx = this_round.tx
    blocked = {c.state.company_id for c in changes if c.change is Change.BLOCKED}
    restored = {c.state.company_id for c in changes if c.change is Change.RESTORED}
    role = tx.default_role()
    # Again after the update, which waited for every user round that had read these companies: a manager
    # such a round moved in meanwhile is among them now.
    managers = tx.lock_managers(sorted(blocked | restored))
    revoked = _revoke(tx, role, [user for user, company in managers.items() if company in blocked])
    granted = _grant_back(tx, role, [user for user, company in managers.items() if company in restored])
    for users, reason in (
        (revoked, AccessChangeReason.ROLE_REVOKED),
        (granted, AccessChangeReason.ROLE_ASSIGNED),
    ):
        notify_access_changed(tx, this_round.ctx, users, reason=reason, changed_role_id=role.role_id)


def _revoke(tx: ReplicaTransaction, role: RoleRecord, leaving: list[UUID]) -> list[UUID]:
    """The default role taken from the managers of a blocked company; whom it was taken from."""
    return sorted({user for user, _ in tx.revoke_user_assignments(leaving, role.role_id)})


def _grant_back(tx: ReplicaTransaction, role: RoleRecord, returning: list[UUID]) -> list[UUID]:
    """The default role again for the managers of a restored company who do not hold it; whom it was for."""
    grants = [
        DefaultGrant(uuid.uuid4(), user, company)
        for user, company in tx.managers_without_default_role(returning, role.role_id)
    ]
    tx.grant_default_role(role, grants)
    return sorted(g.user_id for g in grants)

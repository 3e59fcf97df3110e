"""A round's decisions written (see talent_replica): the companies and users talent_decisions changed, their
managers' default roles following them, their events; what the replica must remember of deletions of entities
it lacks; in a dry run, only what it would have written, for its later pages to decide against.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from uuid import UUID

from pin_identity.domain import events
from pin_identity.domain.events import CompanyState, OutboxMessage
from pin_identity.domain.model import AccessChangeReason
from pin_identity.domain.talent import Change, CompanyChange, ImportStage, UserChange
from pin_identity.operations.context import Context
from pin_identity.operations.identity_changes import notify_access_changed
from pin_identity.operations.ports.identity_records import RoleRecord
from pin_identity.operations.ports.replica import DefaultGrant, DefaultRoles, DryRunMemory, ReplicaWrites
from pin_identity.operations.talent_decisions import TenantsDecided, UsersDecided
from pin_identity.operations.talent_round import ApplyOptions

_ACCESS_CHANGING = (Change.BLOCKED, Change.RESTORED)
_GRANTING = (Change.CREATED, Change.RESTORED, Change.MOVED)


def write_tenants(tx: ReplicaWrites, ctx: Context, options: ApplyOptions, decided: TenantsDecided) -> None:
    """The round's companies, their managers following a company blocked or restored, their events; the
    deletions of tenants the replica lacks remembered."""
    if options.dry_run:
        if options.memory is not None:
            states = {c.state.external_talent_tenant_id: c.state for c in decided.changes}
            options.memory.remember(ImportStage.TENANTS, _by_talent_id(states), {})
        return
    _write_companies(tx, ctx, decided.changes)
    tx.remember_deletions(ImportStage.TENANTS, decided.absent_deletions)


def write_users(tx: ReplicaWrites, ctx: Context, options: ApplyOptions, decided: UsersDecided) -> None:
    """The round's users with their default roles and events; the versioned deletions of users the replica
    lacks remembered."""
    if options.dry_run:
        _remember(options.memory, decided.changes)
        return
    _UserWrite(tx, ctx, decided.changes, decided.blocked_companies).apply()
    tx.remember_deletions(ImportStage.USERS, decided.absent_deletions)


def _by_talent_id(states: dict[UUID | None, CompanyState]) -> dict[UUID, CompanyState]:
    return {talent_id: state for talent_id, state in states.items() if talent_id is not None}


def _remember(memory: DryRunMemory | None, changes: list[UserChange]) -> None:
    """What a dry run's round would have written: its users' states, and the phones they would hold."""
    if memory is None:
        return
    states = {c.state.external_talent_user_id: c.state for c in changes if c.state.external_talent_user_id}
    held = {c.state.phone: c.state.external_talent_user_id for c in changes if c.change is not Change.BLOCKED}
    memory.remember("Users", states, {phone: user for phone, user in held.items() if user is not None})


# ---------------------------------------------------------------- tenants


def _write_companies(tx: ReplicaWrites, ctx: Context, changes: list[CompanyChange]) -> None:
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
        _managers_follow(tx, ctx, changes)


def _managers_follow(tx: ReplicaWrites, ctx: Context, changes: list[CompanyChange]) -> None:
    """A Talent manager holds its organization's default role only while its company is not Blocked: blocking
    a company revokes its managers' default roles (RoleRevoked), restoring it grants them back
    (RoleAssigned)."""
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
        notify_access_changed(tx, ctx, users, reason=reason, changed_role_id=role.role_id)


def _revoke(tx: DefaultRoles, role: RoleRecord, leaving: list[UUID]) -> list[UUID]:
    """The default role taken from the managers of a blocked company; whom it was taken from."""
    return sorted({user for user, _ in tx.revoke_user_assignments(leaving, role.role_id)})


def _grant_back(tx: DefaultRoles, role: RoleRecord, returning: list[UUID]) -> list[UUID]:
    """The default role again for the managers of a restored company who do not hold it; whom it was for."""
    grants = [
        DefaultGrant(uuid.uuid4(), user, company)
        for user, company in tx.managers_without_default_role(returning, role.role_id)
    ]
    tx.grant_default_role(role, grants)
    return sorted(g.user_id for g in grants)


# ---------------------------------------------------------------- users


class _UserWrite:
    """The bulk writes and the events of one round of user changes."""

    def __init__(
        self, tx: ReplicaWrites, ctx: Context, changes: list[UserChange], blocked_companies: set[UUID]
    ):
        self._tx, self._ctx, self._changes = tx, ctx, changes
        # Created in, restored into or moved to a Blocked company: no default role (see _managers_follow).
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
        grants = [
            DefaultGrant(uuid.uuid4(), c.state.user_id, c.state.company_id)
            for c in self._changes
            if c.state.user_id in self._granted and c.state.company_id is not None
        ]
        with self._tx.pipelined():
            # The writes go out at once; the UserUpserted events are encoded while the database applies them.
            self._tx.save_users(created, updated, self._ctx.now)
            self._tx.grant_default_role(role, grants)
            messages = self._events(role, revoked)
        self._tx.add_events(messages)

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
        correlation_id, now, traceparent = self._ctx.correlation_id, self._ctx.now, self._ctx.traceparent
        upserted = [
            events.user_upserted(
                change.state, correlation_id=correlation_id, occurred_at=now, traceparent=traceparent
            )
            for change in self._changes
        ]
        touched = [
            c.state.user_id
            for c in self._changes
            if c.state.user_id in self._granted or revoked.get(c.state.user_id)
        ]
        # Snapshots and versions in one statement, activeAssignments rendered by the database as the
        # fan-out renders them: encoding each user's assignments here was a tenth of a round's time.
        access = self._tx.access_changes(touched) if touched else {}
        messages = []
        for change, upsert in zip(self._changes, upserted, strict=True):
            user_id = change.state.user_id
            messages.append(upsert)
            granted = user_id in self._granted
            for reason, role_id in _access_reasons(granted, role, revoked.get(user_id, [])):
                snapshot, version = access[user_id]
                access_changed = events.rendered_access_changed(
                    snapshot,
                    reason=reason,
                    version=version,
                    changed_role_id=role_id,
                    correlation_id=correlation_id,
                    occurred_at=now,
                    traceparent=traceparent,
                )
                messages.append(access_changed)
        return messages


def _access_reasons(
    granted: bool, role: RoleRecord, revoked_roles: Iterable[UUID]
) -> list[tuple[AccessChangeReason, UUID]]:
    if granted:
        return [(AccessChangeReason.ROLE_ASSIGNED, role.role_id)]
    return [(AccessChangeReason.ROLE_REVOKED, role_id) for role_id in revoked_roles]

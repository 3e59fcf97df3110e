"""The user rules of a round: Talent's managers decided against the replica (their user, their company, who
holds their phone), written in bulk with their default roles and events."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from uuid import UUID

from pin_identity.domain import events
from pin_identity.domain.events import CompanyState, OutboxMessage, UserState
from pin_identity.domain.model import AccessChangeReason, CompanyStatus
from pin_identity.domain.talent import (
    Change,
    Skip,
    UserChange,
    UserContext,
    UserDecision,
    UserSnapshot,
    decide_user,
)
from pin_identity.operations.context import Context
from pin_identity.operations.ports.identity_records import RoleRecord
from pin_identity.operations.ports.replica import DefaultGrant, DryRunMemory, ReplicaTransaction, SourceItem
from pin_identity.operations.talent_round import ItemOutcome, Round, new_id, stand_in

_GRANTING = (Change.CREATED, Change.RESTORED, Change.MOVED)


@dataclass
class _Decided:
    changes: list[UserChange] = field(default_factory=list)
    absent_deletions: list[UserSnapshot] = field(default_factory=list)


def apply_users(this_round: Round, items: Sequence[SourceItem]) -> list[ItemOutcome]:
    """Decide every user of the round against the replica, then write the round in bulk."""
    snapshots = [(item, this_round.snapshot(item, UserSnapshot)) for item in items]
    replica = _UserReplica.read(this_round, [s for _, s in snapshots if isinstance(s, UserSnapshot)])
    decided = _Decided()
    outcomes = this_round.outcomes(snapshots, partial(_decide, replica, decided, not this_round.writes))
    if not this_round.writes:
        _remember(this_round.options.memory, decided.changes)
        return outcomes
    _UserWrite(this_round.tx, this_round.ctx, decided.changes, replica.blocked_companies).apply()
    _remember_absent_deletions(this_round, decided.absent_deletions)
    this_round.forget_tombstoned([s for _, s in snapshots if isinstance(s, UserSnapshot)])
    return outcomes


def _decide(replica: _UserReplica, decided: _Decided, dry_run: bool, snapshot: UserSnapshot) -> UserDecision:
    context = replica.context(snapshot)
    decision = decide_user(snapshot, context, partial(new_id, snapshot.user_id, dry_run))
    if isinstance(decision, UserChange):
        replica.record(decision)
        decided.changes.append(decision)
    elif decision == Skip(stale=False) and context.current is None:
        decided.absent_deletions.append(snapshot)
    return decision


def _remember_absent_deletions(this_round: Round, deletions: list[UserSnapshot]) -> None:
    """A versioned deletion of a user the replica never had must keep older snapshots from creating it: it is
    remembered by its version (the guard then skips them, deferred and quarantined ones included). A tombstone
    has no version: it drops the user's quarantined snapshots instead (Round.forget_tombstoned)."""
    versions: dict[UUID, int] = {}
    for deletion in deletions:
        if deletion.version is not None:
            versions[deletion.user_id] = max(deletion.version, versions.get(deletion.user_id, 0))
    this_round.tx.remember_deletions(this_round.stage, versions)


def _remember(memory: DryRunMemory | None, changes: list[UserChange]) -> None:
    """What a dry run's round would have written: its users' states, and the phones they would hold."""
    if memory is None:
        return
    states = {c.state.external_talent_user_id: c.state for c in changes if c.state.external_talent_user_id}
    held = {c.state.phone: c.state.external_talent_user_id for c in changes if c.change is not Change.BLOCKED}
    memory.remember("Users", states, {phone: user for phone, user in held.items() if user is not None})


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
    def read(cls, this_round: Round, snapshots: list[UserSnapshot]) -> _UserReplica:
        """Users and deletions by Talent id, companies by tenant (shared: their writers wait), phone owners;
        a dry run adds what its earlier pages would have written."""
        tx, writes = this_round.tx, this_round.writes
        user_ids = sorted({s.user_id for s in snapshots})
        users = tx.users_by_talent_id(user_ids, lock=writes)
        tenant_ids = sorted({s.tenant_id for s in snapshots if s.tenant_id is not None})
        known_companies = tx.companies_by_tenant(tenant_ids, shared=writes)
        phones = sorted({s.phone for s in snapshots if s.phone})
        owners = tx.phone_owners(phones)
        if this_round.options.memory is not None:
            known = (users, known_companies, owners)
            _add_dry_run(this_round.options.memory, (user_ids, tenant_ids, phones), known)
        companies, blocked = _companies(known_companies)
        absent = [u for u in user_ids if u not in users]
        deleted = tx.deleted_versions(this_round.stage, absent)
        # Only the consumer defers (an import's barrier has every tenant in before its users).
        deferring = this_round.options.retry_at is not None
        waiting = tx.waiting_versions(this_round.stage, absent) if deferring else {}
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


class _UserWrite:
    """The bulk writes and the events of one round of user changes."""

    def __init__(
        self, tx: ReplicaTransaction, ctx: Context, changes: list[UserChange], blocked_companies: set[UUID]
    ):
        self._tx, self._ctx, self._changes = tx, ctx, changes
        # Created in, restored into or moved to a Blocked company: no default role (see talent_tenants).
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

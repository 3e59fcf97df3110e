"""Talent Identity snapshots and the rules that turn them into replica changes (CONTRACTS section 5).

Pure: the replica's current state goes in, a decision comes out. The continuous consumer and the initial
import both decide through these functions, so they cannot disagree. Every reason an item is quarantined for
is decided here, each a `Quarantine(code, reason)`: snapshot_of (no snapshot of its stage: the edge could not
read it), decide_tenant, decide_user, and conflicted (a write that met a unique constraint).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, TypeVar
from uuid import UUID

from pin_identity.domain.errors import StoreConflictError
from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.model import (
    CompanyStatus,
    CompanyType,
    ContactsManagedBy,
    SyncSource,
    UserStatus,
    UserType,
)

TENANTS_TOPIC = "talent.identity.tenants.v1"
USERS_TOPIC = "talent.identity.users.v1"


class SyncErrorCode(StrEnum):
    INVALID_PAYLOAD = "IDENTITY_SYNC_INVALID_PAYLOAD"
    UNKNOWN_COMPANY_TYPE = "IDENTITY_SYNC_UNKNOWN_COMPANY_TYPE"
    COMPANY_TYPE_IMMUTABLE = "IDENTITY_SYNC_COMPANY_TYPE_IMMUTABLE"
    COMPANY_NOT_FOUND = "IDENTITY_SYNC_COMPANY_NOT_FOUND"
    PHONE_CONFLICT = "IDENTITY_SYNC_PHONE_CONFLICT"


class ImportStage(StrEnum):
    """Which kind of snapshot: also the stage of the import that applies it."""

    TENANTS = "Tenants"
    USERS = "Users"


class ItemResult(StrEnum):
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class TenantSnapshot:
    tenant_id: UUID
    version: int | None  # None: a tombstone, which carries no version
    is_deleted: bool
    name: str = ""
    company_type: str = ""
    tax_id: str | None = None


@dataclass(frozen=True)
class UserSnapshot:
    user_id: UUID
    version: int | None
    is_deleted: bool
    tenant_id: UUID | None = None
    phone: str = ""  # E.164
    email: str | None = None
    first_name: str = ""
    last_name: str = ""
    middle_name: str | None = None


@dataclass(frozen=True)
class InvalidSnapshot:
    """A record that is no snapshot of the contract's shape, and what is wrong with it (naming the field,
    never quoting its value): quarantined as IDENTITY_SYNC_INVALID_PAYLOAD."""

    reason: str


@dataclass(frozen=True)
class TalentItem:
    """One of Talent's records, read once where it came in (adapters/talent_wire.py): nothing after that
    reads the wire format. The ids are what could be read of it even when it is invalid: the quarantine keeps
    a row under `talent_id`, a filtered import keeps its company's items by `tenant_id`."""

    stage: ImportStage
    talent_id: UUID | None  # the company's or the user's own id
    tenant_id: UUID | None  # the company it belongs to (a company: itself); None when the record names none
    snapshot: TenantSnapshot | UserSnapshot | InvalidSnapshot
    payload: Any  # the value as it came, None for a tombstone: what the quarantine keeps

    @property
    def tombstone(self) -> bool:
        """A deletion that carries no value (and so no version, nor a tenant)."""
        return self.payload is None


# ---------------------------------------------------------------- decisions


class Change(StrEnum):
    """What an applied snapshot did to the replica."""

    CREATED = "created"
    UPDATED = "updated"
    BLOCKED = "blocked"
    RESTORED = "restored"  # a deleted entity came back with a newer version
    MOVED = "moved"  # a user now belongs to another tenant: its default role follows


@dataclass(frozen=True)
class Skip:
    stale: bool  # True: the version guard held (INV-6 / INV-10); False: deleting what is absent or blocked


@dataclass(frozen=True)
class Quarantine:
    code: SyncErrorCode
    reason: str


@dataclass(frozen=True)
class CompanyChange:
    change: Change
    state: CompanyState


@dataclass(frozen=True)
class UserChange:
    change: Change
    state: UserState


TenantDecision = CompanyChange | Skip | Quarantine
UserDecision = UserChange | Skip | Quarantine
Decision = TenantDecision | UserDecision

_Snapshot = TypeVar("_Snapshot", TenantSnapshot, UserSnapshot)

_COMPANY_TYPES = {member.value for member in CompanyType}
# What a deletion blocks: the replica's company or user.
_Replicated = TypeVar("_Replicated", CompanyState, UserState)


def snapshot_of(item: TalentItem, kind: type[_Snapshot]) -> _Snapshot | Quarantine:
    """The item's snapshot of its stage's kind, or why it has none (the reason the edge gave, reading it)."""
    snapshot = item.snapshot
    if isinstance(snapshot, kind):
        return snapshot
    reason = snapshot.reason if isinstance(snapshot, InvalidSnapshot) else f"not a {item.stage} snapshot"
    return Quarantine(SyncErrorCode.INVALID_PAYLOAD, reason)


def conflicted(conflict: StoreConflictError) -> Quarantine:
    """An item whose write met a unique constraint no read foresaw (another writer took the phone meanwhile),
    alone in its round: the phone's conflict, or a value the schema refuses."""
    code = SyncErrorCode.PHONE_CONFLICT if conflict.field == "phone" else SyncErrorCode.INVALID_PAYLOAD
    return Quarantine(code, str(conflict))


def _stale(version: int | None, replica_version: int | None) -> bool:
    return version is not None and replica_version is not None and version <= replica_version


def _guard(replica_version: int | None, deleted_version: int | None) -> int | None:
    """The version a snapshot must exceed. An entity deleted (with a version) before the replica ever had it
    is remembered by that version, so an older snapshot arriving later cannot bring it to life."""
    if replica_version is None:
        return deleted_version
    return replica_version


def decide_tenant(
    snapshot: TenantSnapshot,
    current: CompanyState | None,
    new_id: Callable[[], UUID],
    *,
    deleted_version: int | None = None,
) -> TenantDecision:
    """`deleted_version`: the version of a deletion seen while the company was absent (see _guard)."""
    if _stale(snapshot.version, _guard(current.replica_version if current else None, deleted_version)):
        return Skip(stale=True)
    if snapshot.is_deleted:
        return _delete_company(snapshot, current)
    if snapshot.company_type not in _COMPANY_TYPES:
        return Quarantine(SyncErrorCode.UNKNOWN_COMPANY_TYPE, "companyType is not Developer, Agency or Bank")
    if current is None:
        return CompanyChange(Change.CREATED, _new_company(snapshot, new_id()))
    if current.company_type != snapshot.company_type:
        return Quarantine(SyncErrorCode.COMPANY_TYPE_IMMUTABLE, "companyType differs from the replica's")
    change = Change.RESTORED if current.status == CompanyStatus.BLOCKED.value else Change.UPDATED
    updated = replace(
        current,
        name=snapshot.name,
        tax_id=snapshot.tax_id,
        status=CompanyStatus.ACTIVE.value,
        replica_version=snapshot.version,
    )
    return CompanyChange(change, updated)


def _new_company(snapshot: TenantSnapshot, company_id: UUID) -> CompanyState:
    pending = CompanyState(
        company_id=company_id,
        name=snapshot.name,
        company_type=snapshot.company_type,
        status=CompanyStatus.PENDING.value,
        tax_id=snapshot.tax_id,
        sync_source=SyncSource.TALENT_IDENTITY.value,
        external_talent_tenant_id=snapshot.tenant_id,
        replica_version=snapshot.version,
    )
    # Created Pending, active once its first snapshot is applied: both happen in this one change.
    return replace(pending, status=CompanyStatus.ACTIVE.value)


def _deletion(version: int | None, blocked_already: bool) -> Change | None:
    """BLOCKED; or UPDATED when a newer deletion of a blocked entity only moves its version, so that no older
    live snapshot can revive it; None for a tombstone of a blocked entity (nothing to record)."""
    if not blocked_already:
        return Change.BLOCKED
    return Change.UPDATED if version is not None else None


def _blocked(
    version: int | None, current: _Replicated | None, status: str
) -> tuple[Change, _Replicated] | None:
    """The replica's company or user blocked (`status`) by a deletion of `version`; None when there is nothing
    to record (absent, or a tombstone of a blocked one)."""
    if current is None:
        return None
    change = _deletion(version, current.status == status)
    if change is None:
        return None
    replica_version = version if version is not None else current.replica_version
    return change, replace(current, status=status, replica_version=replica_version)


def _delete_company(snapshot: TenantSnapshot, current: CompanyState | None) -> TenantDecision:
    blocked = _blocked(snapshot.version, current, CompanyStatus.BLOCKED.value)
    return CompanyChange(*blocked) if blocked else Skip(stale=False)


def newest_snapshots(snapshots: Sequence[TenantSnapshot | UserSnapshot | InvalidSnapshot]) -> set[int]:
    """Of one entity's snapshots, in whatever order they came, the positions of those the version guard keeps
    when they are applied at once: the newest live one, and a deletion newer than it (which then blocks it).
    A snapshot without a version (a tombstone, an invalid one) is kept: the guard does not hold it back."""
    kept: set[int] = set()
    newest: dict[bool, tuple[int, int]] = {}  # deleted? -> (version, position)
    for position, snapshot in enumerate(snapshots):
        if isinstance(snapshot, InvalidSnapshot) or snapshot.version is None:
            kept.add(position)
            continue
        seen = newest.get(snapshot.is_deleted)
        if seen is None or snapshot.version > seen[0]:
            newest[snapshot.is_deleted] = (snapshot.version, position)
    live, deleted = newest.get(False), newest.get(True)
    if live is not None:
        kept.add(live[1])
    if deleted is not None and (live is None or deleted[0] > live[0]):
        kept.add(deleted[1])
    return kept


@dataclass(frozen=True)
class UserContext:
    """What the replica knows around one user snapshot."""

    current: UserState | None
    company_id: UUID | None  # the replica company of the snapshot's tenant, None if absent
    phone_owner: UUID | None  # the user holding the snapshot's phone, None if free
    deleted_version: int | None = None  # a deletion seen while the user was absent (see _guard)
    waiting_version: int | None = None  # the oldest snapshot of the user deferred until its tenant arrives


def decide_user(snapshot: UserSnapshot, context: UserContext, new_id: Callable[[], UUID]) -> UserDecision:
    current = context.current
    if _stale(
        snapshot.version, _guard(current.replica_version if current else None, context.deleted_version)
    ):
        return Skip(stale=True)
    if snapshot.is_deleted:
        if _behind_a_waiting_snapshot(snapshot, context):
            return Quarantine(
                SyncErrorCode.COMPANY_NOT_FOUND, "an older snapshot of the user awaits its tenant"
            )
        return _delete_user(snapshot, current)
    if context.company_id is None:
        return Quarantine(SyncErrorCode.COMPANY_NOT_FOUND, "the user's tenant is not in the replica")
    return _upsert_user(snapshot, context, context.company_id, new_id)


def _behind_a_waiting_snapshot(snapshot: UserSnapshot, context: UserContext) -> bool:
    """A versioned deletion of an absent user whose older snapshot waits for its tenant waits too: applied
    now it would find nobody to block and make the older one stale, so the user would never exist, where
    the same snapshots in version order create the user and then block it. A tombstone does not wait: it
    is the key's last record and drops what waits (talent_round.settle)."""
    waiting, version = context.waiting_version, snapshot.version
    return context.current is None and waiting is not None and version is not None and waiting < version


def _upsert_user(
    snapshot: UserSnapshot, context: UserContext, company_id: UUID, new_id: Callable[[], UUID]
) -> UserDecision:
    current = context.current
    own_id = current.user_id if current is not None else None
    if context.phone_owner is not None and context.phone_owner != own_id:
        return Quarantine(SyncErrorCode.PHONE_CONFLICT, "the phone belongs to another user (R6)")
    if current is None:
        return UserChange(Change.CREATED, _user_state(snapshot, new_id(), company_id))
    state = _user_state(snapshot, current.user_id, company_id)
    if current.status == UserStatus.BLOCKED.value:
        return UserChange(Change.RESTORED, state)
    moved = current.company_id != company_id
    return UserChange(Change.MOVED if moved else Change.UPDATED, replace(state, status=current.status))


def _user_state(snapshot: UserSnapshot, user_id: UUID, company_id: UUID) -> UserState:
    return UserState(
        user_id=user_id,
        company_id=company_id,
        type=UserType.DEVELOPER_MANAGER.value,
        status=UserStatus.INVITED.value,
        phone=snapshot.phone,
        email=snapshot.email,
        first_name=snapshot.first_name,
        last_name=snapshot.last_name,
        middle_name=snapshot.middle_name,
        contacts_managed_by=ContactsManagedBy.TALENT_SYNC.value,
        sync_source=SyncSource.TALENT_IDENTITY.value,
        external_talent_user_id=snapshot.user_id,
        replica_version=snapshot.version,
    )


def _delete_user(snapshot: UserSnapshot, current: UserState | None) -> UserDecision:
    blocked = _blocked(snapshot.version, current, UserStatus.BLOCKED.value)
    return UserChange(*blocked) if blocked else Skip(stale=False)

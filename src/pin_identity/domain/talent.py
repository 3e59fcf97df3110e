"""Talent Identity snapshots and the rules that turn them into replica changes (CONTRACTS section 5).

Pure: the replica's current state goes in, a decision comes out. The continuous consumer and the initial
import both decide through these functions, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any
from uuid import UUID

from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.model import (
    CompanyStatus,
    CompanyType,
    ContactsManagedBy,
    SyncSource,
    UserStatus,
    UserType,
)
from pin_identity.domain.phone import InvalidPhoneError, normalize_phone

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
class RawSnapshot:
    """One record as the source gave it. `key` is the id as text (the topic key, or the item's own id);
    `payload` is the decoded JSON, None for a tombstone. Nothing is trusted yet."""

    key: str | None
    payload: Any


@dataclass(frozen=True)
class Undecodable:
    """A record whose bytes are not a JSON value a snapshot could be read from (not UTF-8, not JSON, NaN,
    a number of thousands of digits, nested too deeply). Quarantined with `reason`; `text` is what came."""

    reason: str
    text: str


class InvalidSnapshotError(ValueError):
    """The record is not a snapshot of the contract's shape."""


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


# ---------------------------------------------------------------- parsing


def _uuid(value: Any, field: str) -> UUID:
    try:
        return UUID(str(value)) if value is not None else _missing(field)
    except ValueError:
        raise InvalidSnapshotError(f"{field} is not a uuid") from None


def _missing(field: str) -> UUID:
    raise InvalidSnapshotError(f"{field} is missing")


# The longest value each text field may hold: beyond it a snapshot is not a plausible company or person (and
# its event could not be published: a broker refuses records over about 1 MB).
FIELD_LIMITS = {
    "name": 500,
    "companyType": 64,
    "taxId": 64,
    "phone": 64,
    "email": 320,
    "firstName": 200,
    "lastName": 200,
    "middleName": 200,
}
_MAX_VERSION = 2**63 - 1  # the replica keeps versions as bigint


def _text(payload: Mapping[str, Any], field: str, *, optional: bool = False) -> str | None:
    value = payload.get(field)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidSnapshotError(f"{field} must be a non-empty string")
    if len(value) > FIELD_LIMITS[field]:
        raise InvalidSnapshotError(f"{field} is longer than {FIELD_LIMITS[field]} characters")
    if any(ord(char) < 32 or 0xD800 <= ord(char) <= 0xDFFF for char in value):
        # Control characters and lone surrogates (valid JSON escapes) cannot be stored as text.
        raise InvalidSnapshotError(f"{field} contains control characters or invalid Unicode")
    return value.strip()


def _version(payload: Mapping[str, Any]) -> int:
    version = payload.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= _MAX_VERSION:
        raise InvalidSnapshotError("version must be an integer from 1 to 2^63-1")
    return version


def _is_deleted(payload: Mapping[str, Any]) -> bool:
    flag = payload.get("isDeleted", False)
    if not isinstance(flag, bool):
        raise InvalidSnapshotError("isDeleted must be a boolean")
    return flag


def _payload_with_id(raw: RawSnapshot, id_field: str) -> tuple[UUID, Mapping[str, Any] | None]:
    """The record's id, checked against the key, and its payload (None for a tombstone)."""
    if raw.payload is None:
        return _uuid(raw.key, "key"), None
    if isinstance(raw.payload, Undecodable):
        raise InvalidSnapshotError(raw.payload.reason)
    if not isinstance(raw.payload, Mapping):
        raise InvalidSnapshotError("the snapshot is not a JSON object")
    entity_id = _uuid(raw.payload.get(id_field), id_field)
    if raw.key is not None and _uuid(raw.key, "key") != entity_id:
        raise InvalidSnapshotError(f"the record key does not match {id_field}")
    return entity_id, raw.payload


def parse_tenant(raw: RawSnapshot) -> TenantSnapshot:
    tenant_id, payload = _payload_with_id(raw, "tenantId")
    if payload is None:
        return TenantSnapshot(tenant_id, None, is_deleted=True)
    version, deleted = _version(payload), _is_deleted(payload)
    if deleted:
        return TenantSnapshot(tenant_id, version, is_deleted=True)
    return TenantSnapshot(
        tenant_id,
        version,
        is_deleted=False,
        name=_text(payload, "name") or "",
        company_type=_text(payload, "companyType") or "",
        tax_id=_text(payload, "taxId", optional=True),
    )


def parse_user(raw: RawSnapshot) -> UserSnapshot:
    user_id, payload = _payload_with_id(raw, "userId")
    if payload is None:
        return UserSnapshot(user_id, None, is_deleted=True)
    version, deleted = _version(payload), _is_deleted(payload)
    if deleted:
        return UserSnapshot(user_id, version, is_deleted=True)
    try:
        phone = normalize_phone(_text(payload, "phone") or "")
    except InvalidPhoneError as exc:
        raise InvalidSnapshotError(f"phone: {exc}") from None
    return UserSnapshot(
        user_id,
        version,
        is_deleted=False,
        tenant_id=_uuid(payload.get("tenantId"), "tenantId"),
        phone=phone,
        email=_text(payload, "email", optional=True),
        first_name=_text(payload, "firstName") or "",
        last_name=_text(payload, "lastName") or "",
        middle_name=_text(payload, "middleName", optional=True),
    )


def external_id(raw: RawSnapshot, stage: ImportStage) -> UUID | None:
    """The Talent id of a record, as far as it can be read: quarantine rows are found by it."""
    id_field = "tenantId" if stage is ImportStage.TENANTS else "userId"
    candidates = [raw.key]
    if isinstance(raw.payload, Mapping):
        candidates.append(raw.payload.get(id_field))
    for candidate in candidates:
        try:
            return UUID(str(candidate)) if candidate is not None else None
        except ValueError:
            continue
    return None


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

_COMPANY_TYPES = {member.value for member in CompanyType}


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


def _delete_company(snapshot: TenantSnapshot, current: CompanyState | None) -> TenantDecision:
    change = None
    if current is not None:
        change = _deletion(snapshot.version, current.status == CompanyStatus.BLOCKED.value)
    if current is None or change is None:
        return Skip(stale=False)
    version = snapshot.version if snapshot.version is not None else current.replica_version
    return CompanyChange(
        change, replace(current, status=CompanyStatus.BLOCKED.value, replica_version=version)
    )


@dataclass(frozen=True)
class UserContext:
    """What the replica knows around one user snapshot."""

    current: UserState | None
    company_id: UUID | None  # the replica company of the snapshot's tenant, None if absent
    phone_owner: UUID | None  # the user holding the snapshot's phone, None if free
    deleted_version: int | None = None  # a deletion seen while the user was absent (see _guard)


def decide_user(snapshot: UserSnapshot, context: UserContext, new_id: Callable[[], UUID]) -> UserDecision:
    current = context.current
    if _stale(
        snapshot.version, _guard(current.replica_version if current else None, context.deleted_version)
    ):
        return Skip(stale=True)
    if snapshot.is_deleted:
        return _delete_user(snapshot, current)
    if context.company_id is None:
        return Quarantine(SyncErrorCode.COMPANY_NOT_FOUND, "the user's tenant is not in the replica")
    return _upsert_user(snapshot, context, context.company_id, new_id)


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
    change = None
    if current is not None:
        change = _deletion(snapshot.version, current.status == UserStatus.BLOCKED.value)
    if current is None or change is None:
        return Skip(stale=False)
    version = snapshot.version if snapshot.version is not None else current.replica_version
    return UserChange(change, replace(current, status=UserStatus.BLOCKED.value, replica_version=version))

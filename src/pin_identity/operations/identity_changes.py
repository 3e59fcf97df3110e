"""Identity use cases: companies, users, role assignments and role changes, each with its events."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from pin_identity.domain import events
from pin_identity.domain.errors import ConflictError, InvalidInputError, NotFoundError
from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.fanout_policy import FanOutPath, FanOutPolicy
from pin_identity.domain.model import (
    AccessChangeReason,
    CompanyStatus,
    CompanyType,
    ContactsManagedBy,
    RoleStatus,
    Scope,
    SyncSource,
    UserStatus,
    UserType,
    permission_set,
)
from pin_identity.domain.phone import InvalidPhoneError, normalize_phone
from pin_identity.observability import metrics
from pin_identity.operations.context import Context
from pin_identity.operations.documents import PermissionsChanged
from pin_identity.operations.ports.access_events import AccessEventWriter
from pin_identity.operations.ports.identity_records import (
    IdentityTransaction,
    IdentityTransactions,
    NewAssignment,
    RoleRecord,
)


def create_company(
    transactions: IdentityTransactions,
    ctx: Context,
    *,
    name: str,
    company_type: CompanyType,
    tax_id: str | None = None,
) -> UUID:
    company = CompanyState(
        company_id=uuid.uuid4(),
        name=name,
        company_type=company_type.value,
        status=CompanyStatus.ACTIVE.value,
        tax_id=tax_id,
        sync_source=SyncSource.LOCAL.value,
        external_talent_tenant_id=None,
        replica_version=None,
    )
    with transactions() as tx:
        tx.insert_company(company)
        tx.add_events(
            [
                events.company_upserted(
                    company,
                    correlation_id=ctx.correlation_id,
                    occurred_at=ctx.now,
                    traceparent=ctx.traceparent,
                )
            ]
        )
        tx.commit()
    return company.company_id


@dataclass(frozen=True)
class NewUser:
    phone: str
    first_name: str
    last_name: str
    type: UserType = UserType.INVESTOR
    company_id: UUID | None = None
    email: str | None = None
    middle_name: str | None = None


def create_user(transactions: IdentityTransactions, ctx: Context, new: NewUser) -> UUID:
    try:
        phone = normalize_phone(new.phone)
    except InvalidPhoneError as exc:
        raise InvalidInputError(str(exc)) from None
    user = UserState(
        user_id=uuid.uuid4(),
        company_id=new.company_id,
        type=new.type.value,
        status=UserStatus.ACTIVE.value,
        phone=phone,
        email=new.email,
        first_name=new.first_name,
        last_name=new.last_name,
        middle_name=new.middle_name,
        contacts_managed_by=ContactsManagedBy.USER.value,
        sync_source=SyncSource.LOCAL.value,
        external_talent_user_id=None,
        replica_version=None,
    )
    with transactions() as tx:
        tx.insert_user(user)
        tx.add_events(
            [
                events.user_upserted(
                    user, correlation_id=ctx.correlation_id, occurred_at=ctx.now, traceparent=ctx.traceparent
                )
            ]
        )
        tx.commit()
    return user.user_id


def create_role(
    transactions: IdentityTransactions,
    *,
    code: str,
    name: str,
    company_id: UUID | None,
    permissions: Sequence[str],
) -> UUID:
    """A new role with its first permission set (version 1); nobody holds it yet, so no event."""
    role_id = uuid.uuid4()
    with transactions() as tx:
        tx.insert_role(role_id, code, name, company_id)
        tx.replace_role_permissions(role_id, permission_set(permissions), 1)
        tx.commit()
    return role_id


def _active_role(tx: IdentityTransaction, role_id: UUID, *, shared: bool = False) -> RoleRecord:
    role = tx.lock_role(role_id, shared=shared)
    if role is None:
        raise NotFoundError(f"role {role_id} does not exist")
    if role.status is not RoleStatus.ACTIVE:
        raise ConflictError(f"role {role_id} is archived")
    return role


def notify_access_changed(
    tx: AccessEventWriter,
    ctx: Context,
    user_ids: Sequence[UUID],
    *,
    reason: AccessChangeReason,
    changed_role_id: UUID,
    version: int | None = None,
) -> None:
    """UserAccessChanged with a full snapshot; version None means each user's point version."""
    if not user_ids:
        return
    snapshots = tx.access_snapshots(user_ids)
    point_versions = tx.access_versions(user_ids) if version is None else {}
    tx.add_events(
        [
            events.user_access_changed(
                snapshot,
                reason=reason,
                version=version if version is not None else point_versions[snapshot.user_id],
                changed_role_id=changed_role_id,
                correlation_id=ctx.correlation_id,
                occurred_at=ctx.now,
                traceparent=ctx.traceparent,
            )
            for snapshot in snapshots
        ]
    )


def grant_role_assignment(
    transactions: IdentityTransactions,
    ctx: Context,
    *,
    user_id: UUID,
    role_id: UUID,
    scope: Scope,
    expires_at: datetime | None = None,
) -> UUID:
    assignment_id = uuid.uuid4()
    with transactions() as tx:
        # The role before the user: every writer takes its locks in that order (no deadlock with an
        # inline set-role-permissions, which holds the role and then waits for the role's users).
        role = _active_role(tx, role_id, shared=True)
        if not tx.lock_user(user_id):
            raise NotFoundError(f"user {user_id} does not exist")
        if tx.holds(user_id, role_id, scope):
            raise ConflictError(f"user {user_id} already holds role {role_id} in this scope")
        version = tx.next_assignment_version(user_id)
        tx.insert_assignment(NewAssignment(assignment_id, role, user_id, scope, expires_at, version))
        notify_access_changed(
            tx, ctx, [user_id], reason=AccessChangeReason.ROLE_ASSIGNED, changed_role_id=role_id
        )
        tx.commit()
    return assignment_id


def revoke_role_assignment(transactions: IdentityTransactions, ctx: Context, assignment_id: UUID) -> None:
    with transactions() as tx:
        found = tx.assignment(assignment_id)
        if found is None:
            raise NotFoundError(f"role assignment {assignment_id} does not exist")
        tx.lock_user(found.user_id)
        current = tx.assignment(assignment_id)
        if current is None or not current.active:
            return  # already revoked: revoking again changes nothing and announces nothing
        tx.revoke_assignment(assignment_id, tx.next_assignment_version(found.user_id))
        notify_access_changed(
            tx, ctx, [found.user_id], reason=AccessChangeReason.ROLE_REVOKED, changed_role_id=found.role_id
        )
        tx.commit()


def archive_role(transactions: IdentityTransactions, ctx: Context, role_id: UUID) -> int:
    """INV-R5: the role's Active assignments are revoked and each affected user hears RoleArchived."""
    with transactions() as tx:
        role = _active_role(tx, role_id)
        tx.lock_users_of_role(role_id)
        tx.archive_role(role_id, role.version + 1)
        affected = sorted(set(tx.revoke_role_assignments(role_id)))
        notify_access_changed(
            tx, ctx, affected, reason=AccessChangeReason.ROLE_ARCHIVED, changed_role_id=role_id
        )
        tx.commit()
    return len(affected)


def set_role_permissions(
    transactions: IdentityTransactions,
    ctx: Context,
    *,
    role_id: UUID,
    permissions: Sequence[str],
    policy: FanOutPolicy,
) -> PermissionsChanged:
    """Replace the permission set, bump the role's version, then notify inline or enqueue the fan-out."""
    codes = permission_set(permissions)
    with transactions() as tx:
        role = _active_role(tx, role_id)
        version = role.version + 1
        tx.replace_role_permissions(role_id, codes, version)
        path = policy.path_for(tx.count_active_users(role_id, policy.users_to_count))
        task_id, notified = None, 0
        if path is FanOutPath.INLINE:
            # Locked before their snapshots are read: a point change committing meanwhile is either
            # announced before these events or waits for them (CONTRACTS section 4, convergence).
            users = tx.lock_active_users(role_id)
            notify_access_changed(
                tx,
                ctx,
                users,
                reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
                changed_role_id=role_id,
                version=version,
            )
            notified = len(users)
        else:
            task_id = tx.enqueue_fanout_task(role, version, ctx.now)
        tx.commit()
    if path is FanOutPath.INLINE:  # a task's size is observed by the fan-out job when it completes
        metrics.fanout_size.observe(notified)
    return PermissionsChanged(
        role_id=role_id, role_version=version, path=path, users_notified_inline=notified, task_id=task_id
    )

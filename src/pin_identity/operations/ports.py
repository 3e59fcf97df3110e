"""What the use cases need from storage; the PostgreSQL adapter implements it."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from pin_identity.domain.events import CompanyState, OutboxMessage, UserState
from pin_identity.domain.model import RoleStatus, Scope, UserAccessSnapshot


@dataclass(frozen=True)
class RoleRecord:
    role_id: UUID
    code: str
    company_id: UUID | None
    status: RoleStatus
    version: int


@dataclass(frozen=True)
class AssignmentRecord:
    user_id: UUID
    role_id: UUID
    active: bool


class IdentityTransaction(Protocol):
    """One open transaction; nothing is visible to others until commit()."""

    def commit(self) -> None: ...

    def insert_company(self, company: CompanyState) -> None: ...
    def insert_user(self, user: UserState) -> None: ...
    def lock_user(self, user_id: UUID) -> bool: ...
    def lock_users_of_role(self, role_id: UUID) -> None: ...

    def insert_role(self, role_id: UUID, code: str, name: str, company_id: UUID | None) -> None: ...
    def lock_role(self, role_id: UUID) -> RoleRecord | None: ...
    def replace_role_permissions(self, role_id: UUID, codes: Sequence[str], version: int) -> None: ...
    def archive_role(self, role_id: UUID, version: int) -> None: ...

    def next_assignment_version(self, user_id: UUID) -> int: ...
    def insert_assignment(
        self,
        *,
        assignment_id: UUID,
        role: RoleRecord,
        user_id: UUID,
        scope: Scope,
        expires_at: datetime | None,
        version: int,
    ) -> None: ...
    def assignment(self, assignment_id: UUID) -> AssignmentRecord | None: ...
    def revoke_assignment(self, assignment_id: UUID, version: int) -> None: ...
    def revoke_role_assignments(self, role_id: UUID) -> list[UUID]: ...
    def access_versions(self, user_ids: Sequence[UUID]) -> dict[UUID, int]: ...

    def count_active_users(self, role_id: UUID, limit: int) -> int: ...
    def active_user_ids(self, role_id: UUID) -> list[UUID]: ...
    def access_snapshots(self, user_ids: Sequence[UUID]) -> list[UserAccessSnapshot]: ...

    def enqueue_fanout_task(self, role: RoleRecord, role_version: int, now: datetime) -> UUID: ...
    def add_events(self, messages: Sequence[OutboxMessage]) -> None: ...


class IdentityTransactions(Protocol):
    """Opens a transaction; leaving the block without commit() rolls it back."""

    def __call__(self) -> AbstractContextManager[IdentityTransaction]: ...

"""Companies, users, roles and assignments as operators write them, and the roles as operators list them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeAlias
from uuid import UUID

from pydantic import Field

from pin_identity.domain.api_model import ApiModel
from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.model import RoleStatus, Scope
from pin_identity.operations.ports.access_events import AccessEventWriter
from pin_identity.operations.ports.transactions import Transaction, Transactions


@dataclass(frozen=True)
class RoleRecord:
    role_id: UUID
    code: str
    company_id: UUID | None
    status: RoleStatus
    version: int


@dataclass(frozen=True)
class NewAssignment:
    """A role granted to a user in a scope, as the assignment's first version is written."""

    assignment_id: UUID
    role: RoleRecord
    user_id: UUID
    scope: Scope
    expires_at: datetime | None
    version: int


@dataclass(frozen=True)
class AssignmentRecord:
    user_id: UUID
    role_id: UUID
    active: bool


class IdentityTransaction(AccessEventWriter, Transaction, Protocol):
    """One operator's transaction over identities, roles and assignments."""

    def insert_company(self, company: CompanyState) -> None: ...
    def insert_user(self, user: UserState) -> None: ...
    def lock_user(self, user_id: UUID) -> bool: ...
    def lock_users_of_role(self, role_id: UUID) -> None: ...

    def insert_role(self, role_id: UUID, code: str, name: str, company_id: UUID | None) -> None: ...
    def lock_role(self, role_id: UUID, *, shared: bool = False) -> RoleRecord | None: ...
    def replace_role_permissions(self, role_id: UUID, codes: Sequence[str], version: int) -> None: ...
    def archive_role(self, role_id: UUID, version: int) -> None: ...

    def next_assignment_version(self, user_id: UUID) -> int: ...
    def insert_assignment(self, assignment: NewAssignment) -> None: ...
    def holds(self, user_id: UUID, role_id: UUID, scope: Scope) -> bool:
        """Whether the user already has this role Active in this scope."""

    def assignment(self, assignment_id: UUID) -> AssignmentRecord | None: ...
    def revoke_assignment(self, assignment_id: UUID, version: int) -> None: ...
    def revoke_role_assignments(self, role_id: UUID) -> list[UUID]: ...

    def count_active_users(self, role_id: UUID, limit: int) -> int: ...
    def lock_active_users(self, role_id: UUID) -> list[UUID]:
        """The role's users, in id order, locked against changes of their assignments until commit."""

    def enqueue_fanout_task(self, role: RoleRecord, role_version: int, now: datetime) -> UUID: ...


IdentityTransactions: TypeAlias = Transactions[IdentityTransaction]


# A role with its permissions and its size.
class RoleView(ApiModel):
    """`GET /admin/v1/roles[/{roleId}]`, `roles list|show --json`."""

    role_id: UUID
    code: str
    name: str
    company_id: UUID | None = Field(description="Null for a system role.")
    company_name: str | None
    status: RoleStatus
    version: int
    permissions: list[str]
    holders: int = Field(description="Users holding an Active assignment of the role: its fan-out size.")


class RoleSummaries(Protocol):
    def roles(
        self, *, role_id: UUID | None = None, code: str | None = None, limit: int = 100
    ) -> list[RoleView]:
        """One role by id, or roles by code, or the first `limit`: system roles first, then by company and
        code."""
        ...

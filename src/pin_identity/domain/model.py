"""Enumerations and value objects of the identity context (CONTRACTS section 3)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple
from uuid import UUID

from pin_identity.domain.errors import InvalidInputError

# The system role a Talent manager holds in its own organization (its row comes with the first migration).
DEVELOPER_MANAGER_ROLE_CODE = "developer-manager"


class CompanyType(StrEnum):
    DEVELOPER = "Developer"
    AGENCY = "Agency"
    BANK = "Bank"


class CompanyStatus(StrEnum):
    PENDING = "Pending"
    ACTIVE = "Active"
    BLOCKED = "Blocked"


class SyncSource(StrEnum):
    LOCAL = "Local"
    TALENT_IDENTITY = "TalentIdentity"


class UserType(StrEnum):
    INVESTOR = "Investor"
    DEVELOPER_MANAGER = "DeveloperManager"
    PLATFORM_ADMIN = "PlatformAdmin"


class UserStatus(StrEnum):
    INVITED = "Invited"
    ACTIVE = "Active"
    BLOCKED = "Blocked"


class ContactsManagedBy(StrEnum):
    USER = "User"
    TALENT_SYNC = "TalentSync"


class RoleStatus(StrEnum):
    ACTIVE = "Active"
    ARCHIVED = "Archived"


class ScopeType(StrEnum):
    PLATFORM = "Platform"
    ORGANIZATION = "Organization"
    PROJECT_GROUP = "ProjectGroup"
    PROJECT = "Project"


class AccessChangeReason(StrEnum):
    ROLE_ASSIGNED = "RoleAssigned"
    ROLE_REVOKED = "RoleRevoked"
    ROLE_EXPIRED = "RoleExpired"
    ROLE_PERMISSIONS_CHANGED = "RolePermissionsChanged"
    ROLE_ARCHIVED = "RoleArchived"


class FanOutTaskStatus(StrEnum):
    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"


@dataclass(frozen=True)
class Scope:
    """Where a role assignment applies; exactly the id its type needs is set."""

    type: ScopeType
    organization_id: UUID | None = None
    project_group_id: UUID | None = None
    project_id: UUID | None = None

    def __post_init__(self) -> None:
        if (
            (self.type is ScopeType.ORGANIZATION and self.organization_id is None)
            or (self.type is ScopeType.PROJECT_GROUP and self.project_group_id is None)
            or (self.type is ScopeType.PROJECT and self.project_id is None)
        ):
            raise ValueError(f"a {self.type} scope needs its id")

    @classmethod
    def organization(cls, company_id: UUID) -> Scope:
        return cls(ScopeType.ORGANIZATION, organization_id=company_id)


@dataclass(frozen=True)
class ActiveAssignment:
    """One entry of a user's access snapshot (ActiveRoleAssignmentSnapshot)."""

    assignment_id: UUID
    role_id: UUID
    role_code: str
    scope: Scope
    expires_at: datetime | None


class RenderedAccessSnapshot(NamedTuple):
    """A user's access snapshot as the database renders it: activeAssignments already in wire form (JSON)."""

    user_id: UUID
    company_id: UUID | None
    assignments_json: str


@dataclass(frozen=True)
class UserAccessSnapshot:
    """A user's full list of Active assignments across all roles, sorted by assignment id."""

    user_id: UUID
    company_id: UUID | None
    assignments: tuple[ActiveAssignment, ...]


# ---------------------------------------------------------------- what a role's permission set may hold

# One rule for every surface: the use case refuses a set against it, and the HTTP API's request document
# states the same numbers in its schema (so a client sees them in /openapi.json).
PERMISSION_CODE_MAX_LENGTH = 200  # short enough for the primary key's index
PERMISSIONS_PER_ROLE_MAX = 1000
# No control characters: PostgreSQL text refuses NUL, and a code is printed on one line.
PERMISSION_CODE_PATTERN = r"^[^\x00-\x1f\x7f]+$"
_PERMISSION_CODE = re.compile(PERMISSION_CODE_PATTERN)


def permission_set(codes: Sequence[str]) -> list[str]:
    """A role's new permission set from the codes given: each as the rule allows (not empty, no longer than
    PERMISSION_CODE_MAX_LENGTH, no control character), at most PERMISSIONS_PER_ROLE_MAX of them; then trimmed,
    each once, sorted. InvalidInputError says what is refused."""
    if len(codes) > PERMISSIONS_PER_ROLE_MAX:
        raise InvalidInputError(
            f"a role holds at most {PERMISSIONS_PER_ROLE_MAX} permission codes, not {len(codes)}"
        )
    for code in codes:
        _check_permission_code(code)
    trimmed = sorted({code.strip() for code in codes})
    if "" in trimmed:
        raise InvalidInputError("a permission code cannot be empty")
    return trimmed


def _check_permission_code(code: str) -> None:
    if not code:
        raise InvalidInputError("a permission code cannot be empty")
    if len(code) > PERMISSION_CODE_MAX_LENGTH:
        raise InvalidInputError(
            f"a permission code is at most {PERMISSION_CODE_MAX_LENGTH} characters, not {len(code)}"
            f" ({code[:20]!r}...)"
        )
    # fullmatch: `$` alone also matches before a final newline.
    if _PERMISSION_CODE.fullmatch(code) is None:
        raise InvalidInputError(f"a permission code cannot hold a control character: {code!r}")

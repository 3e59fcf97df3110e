"""Test data through the real use cases, plus a fast bulk path for large roles (the benchmarks' too)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.model import CompanyType, Scope, UserType
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from pin_identity.operations.documents import PermissionsChanged
from pin_identity.operations.ports.identity_records import IdentityTransactions
from tests.support.phones import next_phone


def company(transactions: IdentityTransactions, name: str = "Stroy Invest") -> UUID:
    return identity_changes.create_company(
        transactions,
        Context.fresh(SYSTEM_CLOCK),
        name=name,
        company_type=CompanyType.DEVELOPER,
        tax_id="7701234567",
    )


def user(transactions: IdentityTransactions, company_id: UUID | None = None) -> UUID:
    return identity_changes.create_user(
        transactions,
        Context.fresh(SYSTEM_CLOCK),
        identity_changes.NewUser(
            phone=next_phone(),
            first_name="Ivan",
            last_name="Petrov",
            type=UserType.DEVELOPER_MANAGER,
            company_id=company_id,
        ),
    )


def role(transactions: IdentityTransactions, company_id: UUID | None, code: str = "sales-manager") -> UUID:
    return identity_changes.create_role(
        transactions, code=code, name=code, company_id=company_id, permissions=["deals.read"]
    )


def grant(transactions: IdentityTransactions, user_id: UUID, role_id: UUID, company_id: UUID) -> UUID:
    """The role for the user across its company."""
    return grant_in(transactions, user_id, role_id, Scope.organization(company_id))


def grant_in(
    transactions: IdentityTransactions,
    user_id: UUID,
    role_id: UUID,
    scope: Scope,
    expires_at: datetime | None = None,
) -> UUID:
    return identity_changes.grant_role_assignment(
        transactions,
        Context.fresh(SYSTEM_CLOCK),
        user_id=user_id,
        role_id=role_id,
        scope=scope,
        expires_at=expires_at,
    )


def held_role(
    transactions: IdentityTransactions, holders: int, code: str = "sales-manager"
) -> tuple[UUID, UUID]:
    """A new company and a role of it granted company-wide to `holders` new users: (company id, role id)."""
    company_id = company(transactions)
    role_id = role(transactions, company_id, code)
    for _ in range(holders):
        grant(transactions, user(transactions, company_id), role_id, company_id)
    return company_id, role_id


def bulk_held_role(
    transactions: IdentityTransactions, database_url: str, holders: int
) -> tuple[UUID, UUID, list[UUID]]:
    """A new company and a role of it held company-wide by `holders` users written in bulk (no events for
    them): (company id, role id, user ids)."""
    company_id, role_id = held_role(transactions, holders=0)
    return company_id, role_id, bulk_role_members(database_url, role_id, company_id, holders)


def change_permissions(
    transactions: IdentityTransactions, role_id: UUID, permissions: Sequence[str], policy: FanOutPolicy
) -> PermissionsChanged:
    """The role's permissions replaced through the use case (inline or queued, as the policy decides)."""
    return identity_changes.set_role_permissions(
        transactions,
        Context.fresh(SYSTEM_CLOCK),
        role_id=role_id,
        permissions=permissions,
        policy=policy,
    )


def bulk_role_members(database_url: str, role_id: UUID, company_id: UUID, count: int) -> list[UUID]:
    """`count` users holding the role, written straight to the tables (no events): data for large fan-outs."""
    user_ids = sorted(uuid.uuid4() for _ in range(count))
    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        copy_users(cur, company_id, user_ids)
        copy_assignments(cur, company_id, {user_id: [BulkAssignment(role_id)] for user_id in user_ids})
    return user_ids


# ---------------------------------------------------------------- the bulk path: rows written straight


@dataclass(frozen=True)
class BulkAssignment:
    """A role_assignments row as the bulk path writes it: company-wide unless its scope names a project."""

    role_id: UUID
    scope_type: str = "Organization"
    status: str = "Active"
    expires_at: datetime | None = None
    project_id: UUID | None = None
    id: UUID = field(default_factory=uuid.uuid4)


_USER_COLUMNS = "id, company_id, type, status, phone, first_name, last_name"
_ASSIGNMENT_COLUMNS = (
    "id, role_id, user_id, company_id, scope_type, scope_organization_id, scope_project_id,"
    " status, expires_at, version"
)


def bulk_company(cur: psycopg.Cursor[Any], name: str, role_codes: Sequence[str]) -> tuple[UUID, list[UUID]]:
    """A company and roles of it (by code) written straight to the tables: (company id, role ids)."""
    company_id, role_ids = uuid.uuid4(), [uuid.uuid4() for _ in role_codes]
    cur.execute(
        "INSERT INTO identity.companies (id, name, company_type, status)"
        " VALUES (%s, %s, 'Developer', 'Active')",
        (company_id, name),
    )
    for role_id, code in zip(role_ids, role_codes, strict=True):
        cur.execute(
            "INSERT INTO identity.role_definitions (id, code, name, company_id) VALUES (%s, %s, %s, %s)",
            (role_id, code, code, company_id),
        )
    return company_id, role_ids


def copy_users(cur: psycopg.Cursor[Any], company_id: UUID, user_ids: Sequence[UUID]) -> None:
    """Active managers of the company, in the order given, each with a phone of its own."""
    with cur.copy(f"COPY identity.users ({_USER_COLUMNS}) FROM STDIN") as cp:
        for user_id in user_ids:
            cp.write_row((user_id, company_id, "DeveloperManager", "Active", next_phone(), "A", "B"))


def copy_assignments(
    cur: psycopg.Cursor[Any], company_id: UUID, held: Mapping[UUID, Sequence[BulkAssignment]]
) -> None:
    """Each user's assignments (the later ones of a user at later versions), in the order given: the heap is
    then clustered as the caller granted, not by user."""
    with cur.copy(f"COPY identity.role_assignments ({_ASSIGNMENT_COLUMNS}) FROM STDIN") as cp:
        for user_id, assignments in held.items():
            for version, a in enumerate(assignments, start=1):
                organization = company_id if a.scope_type == "Organization" else None
                cp.write_row(
                    (a.id, a.role_id, user_id, company_id, a.scope_type, organization,
                     a.project_id, a.status, a.expires_at, version)
                )  # fmt: skip

"""Test data through the real use cases, plus a fast bulk path for large roles."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

import psycopg

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.domain.fanout import FanOutPolicy
from pin_identity.domain.model import CompanyType, Scope, UserType
from pin_identity.operations import identity
from pin_identity.operations.ports.identity import IdentityTransactions
from tests.support.phones import next_phone


def company(transactions: IdentityTransactions, name: str = "Stroy Invest") -> UUID:
    return identity.create_company(
        transactions,
        identity.Context.fresh(SYSTEM_CLOCK),
        name=name,
        company_type=CompanyType.DEVELOPER,
        tax_id="7701234567",
    )


def user(transactions: IdentityTransactions, company_id: UUID | None = None) -> UUID:
    return identity.create_user(
        transactions,
        identity.Context.fresh(SYSTEM_CLOCK),
        identity.NewUser(
            phone=next_phone(),
            first_name="Ivan",
            last_name="Petrov",
            type=UserType.DEVELOPER_MANAGER,
            company_id=company_id,
        ),
    )


def role(transactions: IdentityTransactions, company_id: UUID | None, code: str = "sales-manager") -> UUID:
    return identity.create_role(
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
    return identity.grant_role_assignment(
        transactions,
        identity.Context.fresh(SYSTEM_CLOCK),
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


def change_permissions(
    transactions: IdentityTransactions, role_id: UUID, permissions: Sequence[str], policy: FanOutPolicy
) -> identity.PermissionsChange:
    """The role's permissions replaced through the use case (inline or queued, as the policy decides)."""
    return identity.set_role_permissions(
        transactions,
        identity.Context.fresh(SYSTEM_CLOCK),
        role_id=role_id,
        permissions=permissions,
        policy=policy,
    )


def bulk_role_members(database_url: str, role_id: UUID, company_id: UUID, count: int) -> list[UUID]:
    """`count` users holding the role, written straight to the tables (no events): data for large fan-outs."""
    user_ids = sorted(uuid.uuid4() for _ in range(count))
    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY identity.users (id, company_id, type, status, phone, first_name, last_name) FROM STDIN"
        ) as cp:
            for user_id in user_ids:
                cp.write_row((user_id, company_id, "DeveloperManager", "Active", next_phone(), "A", "B"))
        with cur.copy(
            "COPY identity.role_assignments"
            " (id, role_id, user_id, company_id, scope_type, scope_organization_id) FROM STDIN"
        ) as cp:
            for user_id in user_ids:
                cp.write_row((uuid.uuid4(), role_id, user_id, company_id, "Organization", company_id))
    return user_ids

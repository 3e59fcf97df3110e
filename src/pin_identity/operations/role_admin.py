"""The operator's side of roles: the roles with their size, and set-role-permissions (CONTRACTS sections 2
and 6)."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import NotFoundError
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.operations import identity_changes
from pin_identity.operations.action_log import Actor, admin_action
from pin_identity.operations.context import Context
from pin_identity.operations.documents import PermissionsChanged
from pin_identity.operations.ports.identity_records import IdentityTransactions, RoleSummaries, RoleView


class RoleAdmin:
    def __init__(
        self, transactions: IdentityTransactions, policy: FanOutPolicy, summaries: RoleSummaries, clock: Clock
    ):
        self._transactions, self._policy, self._summaries, self._clock = (
            transactions,
            policy,
            summaries,
            clock,
        )

    def roles(self, code: str | None = None, limit: int = 100) -> list[RoleView]:
        """Roles with their permissions and size: system roles first, then by company and code."""
        return self._summaries.roles(code=code, limit=limit)

    def role(self, role_id: UUID) -> RoleView:
        found = self._summaries.roles(role_id=role_id, limit=1)
        if not found:
            raise NotFoundError(f"role {role_id} does not exist")
        return found[0]

    def set_permissions(self, role_id: UUID, permissions: Sequence[str], *, who: Actor) -> PermissionsChanged:
        """Replace the set, bump the role's version, notify its users inline (a small role) or enqueue a
        fan-out task, in one transaction."""
        change = identity_changes.set_role_permissions(
            self._transactions,
            Context.fresh(self._clock),
            role_id=role_id,
            permissions=permissions,
            policy=self._policy,
        )
        admin_action(
            "set-role-permissions",
            who,
            role_id=str(role_id),
            role_version=change.role_version,
            path=change.path.value,
            task_id=str(change.task_id) if change.task_id else None,
        )
        return change

"""`/admin/v1/roles`: roles with their permissions and size, and set-role-permissions."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from pin_identity.entrypoints.admin_http.problems import problem_responses
from pin_identity.entrypoints.admin_http.routing import ContainerDep, RoleId, Who, admin_router
from pin_identity.entrypoints.documents import SetRolePermissions
from pin_identity.operations.documents import PermissionsChanged
from pin_identity.operations.ports.identity_records import RoleView

roles = admin_router("/admin/v1/roles", "roles")


@roles.put(
    "/{roleId}/permissions", response_model=PermissionsChanged, responses=problem_responses(404, 409, 422)
)
def set_role_permissions(
    role_id: RoleId, body: SetRolePermissions, container: ContainerDep, who: Who
) -> PermissionsChanged:
    """set-role-permissions: replace the set, bump the role's version, notify its users inline (role size
    <= PIN_IDENTITY_INLINE_FANOUT_THRESHOLD) or enqueue a fan-out task, in one transaction."""
    return container.use_cases.role_admin.set_permissions(role_id, body.permissions, who=who)


@roles.get("", response_model=list[RoleView])
def list_roles(
    container: ContainerDep,
    code: Annotated[
        str | None,
        # No control characters: PostgreSQL text refuses NUL, and no code holds one.
        Query(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$", description="Only this code."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[RoleView]:
    """Roles with their permissions and size: system roles first, then by company and code."""
    return container.use_cases.role_admin.roles(code=code, limit=limit)


@roles.get("/{roleId}", response_model=RoleView, responses=problem_responses(404))
def get_role(role_id: RoleId, container: ContainerDep) -> RoleView:
    """One role with its permissions and size."""
    return container.use_cases.role_admin.role(role_id)

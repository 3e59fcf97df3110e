"""Each use case against real PostgreSQL and the real broker: rows written, events consumed back."""

from __future__ import annotations

import uuid
from uuid import UUID

import psycopg
import pytest

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.composition.stores import Stores
from pin_identity.domain.errors import ConflictError
from pin_identity.domain.fanout_policy import FanOutPath, FanOutPolicy
from pin_identity.domain.model import Scope, ScopeType
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from tests.support import seed
from tests.support.kafka_tap import ConsumedEvent, EventTap
from tests.support.relay import publish_outbox
from tests.support.schemas import validate_event


def _for(aggregate_id: UUID, event_type: str = "UserAccessChanged"):  # type: ignore[no-untyped-def]
    return lambda e: e.key == str(aggregate_id) and e.body["eventType"] == event_type


def _check_envelope(event: ConsumedEvent, topic: str, aggregate_type: str) -> None:
    validate_event(event.body)
    assert event.topic == topic
    assert event.body["aggregateType"] == aggregate_type
    assert event.body["aggregateId"] == event.key
    assert event.headers["event-type"] == event.body["eventType"]
    assert event.headers["contract-version"] == "1"
    assert event.headers["correlation-id"] == event.body["correlationId"]


def test_create_company_and_user_publish_upserts(
    container: Container, stores: Stores, tap: EventTap, database_url: str
) -> None:
    company_id = seed.company(stores.identity_transactions, name="Stroy Invest")
    user_id = seed.user(stores.identity_transactions, company_id)
    publish_outbox(container)

    [company_event] = tap.wait_for(_for(company_id, "CompanyUpserted"), 1)
    _check_envelope(company_event, "pin.identity.companies.v1", "Company")
    assert company_event.payload == {
        "companyId": str(company_id),
        "name": "Stroy Invest",
        "companyType": "Developer",
        "status": "Active",
        "taxId": "7701234567",
        "syncSource": "Local",
        "externalTalentTenantId": None,
        "replicaVersion": None,
    }
    [user_event] = tap.wait_for(_for(user_id, "UserUpserted"), 1)
    _check_envelope(user_event, "pin.identity.users.v1", "User")
    with psycopg.connect(database_url) as conn:
        phone, status = conn.execute(
            "SELECT phone, status FROM identity.users WHERE id = %s", (user_id,)
        ).fetchone()
    assert user_event.payload["phone"] == phone and phone.startswith("+7912")
    assert user_event.payload["companyId"] == str(company_id)
    assert user_event.payload["status"] == status == "Active"
    assert user_event.payload["contactsManagedBy"] == "User"


def test_grant_and_revoke_publish_full_snapshots_with_point_versions(
    container: Container, stores: Stores, tap: EventTap
) -> None:
    company_id = seed.company(stores.identity_transactions)
    user_id = seed.user(stores.identity_transactions, company_id)
    sales = seed.role(stores.identity_transactions, company_id, "sales-manager")
    viewer = seed.role(stores.identity_transactions, company_id, "viewer")
    first = seed.grant(stores.identity_transactions, user_id, sales, company_id)
    second = seed.grant(stores.identity_transactions, user_id, viewer, company_id)
    identity_changes.revoke_role_assignment(stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), first)
    publish_outbox(container)

    granted_1, granted_2, revoked = tap.wait_for(_for(user_id), 3)
    for event in (granted_1, granted_2, revoked):
        _check_envelope(event, "pin.identity.access.v1", "User")
    assert [e.payload["changeReason"] for e in (granted_1, granted_2, revoked)] == [
        "RoleAssigned",
        "RoleAssigned",
        "RoleRevoked",
    ]
    assert [e.payload["version"] for e in (granted_1, granted_2, revoked)] == [1, 2, 3]
    assert [e.payload["changedRoleId"] for e in (granted_1, granted_2, revoked)] == [
        str(sales),
        str(viewer),
        str(sales),
    ]
    assert [a["assignmentId"] for a in granted_2.payload["activeAssignments"]] == sorted(
        [str(first), str(second)]
    )
    assert revoked.payload["activeAssignments"] == [
        {
            "assignmentId": str(second),
            "roleId": str(viewer),
            "roleCode": "viewer",
            "scopeType": "Organization",
            "scopeOrganizationId": str(company_id),
            "scopeProjectGroupId": None,
            "scopeProjectId": None,
            "expiresAt": None,
        }
    ]
    assert revoked.payload["companyId"] == str(company_id)


def test_revoking_twice_announces_once(container: Container, stores: Stores, tap: EventTap) -> None:
    company_id = seed.company(stores.identity_transactions)
    user_id = seed.user(stores.identity_transactions, company_id)
    assignment = seed.grant(
        stores.identity_transactions,
        user_id,
        seed.role(stores.identity_transactions, company_id),
        company_id,
    )
    identity_changes.revoke_role_assignment(
        stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), assignment
    )
    identity_changes.revoke_role_assignment(
        stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), assignment
    )
    publish_outbox(container)
    events = tap.read_to_end(_for(user_id))
    assert [e.payload["changeReason"] for e in events] == ["RoleAssigned", "RoleRevoked"]


def test_archive_role_revokes_its_assignments_and_tells_each_user(
    container: Container, stores: Stores, tap: EventTap, database_url: str
) -> None:
    company_id = seed.company(stores.identity_transactions)
    archived = seed.role(stores.identity_transactions, company_id, "to-archive")
    kept = seed.role(stores.identity_transactions, company_id, "kept")
    holders = [seed.user(stores.identity_transactions, company_id) for _ in range(3)]
    for user_id in holders:
        seed.grant(stores.identity_transactions, user_id, archived, company_id)
    seed.grant(stores.identity_transactions, holders[0], kept, company_id)
    bystander = seed.user(stores.identity_transactions, company_id)
    seed.grant(stores.identity_transactions, bystander, kept, company_id)

    affected = identity_changes.archive_role(
        stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), archived
    )
    publish_outbox(container)

    assert affected == 3
    archived_events = tap.wait_for(
        lambda e: (
            e.body["eventType"] == "UserAccessChanged"
            and e.payload["changeReason"] == "RoleArchived"
            and e.payload["changedRoleId"] == str(archived)
        ),
        3,
    )
    assert sorted(e.key for e in archived_events) == sorted(str(u) for u in holders)
    by_user = {e.key: e.payload for e in archived_events}
    assert [a["roleCode"] for a in by_user[str(holders[0])]["activeAssignments"]] == ["kept"]
    assert by_user[str(holders[1])]["activeAssignments"] == []
    assert by_user[str(holders[1])]["version"] == 2  # grant was 1, the revocation bumped it
    with psycopg.connect(database_url) as conn:
        statuses = conn.execute(
            "SELECT status, count(*) FROM identity.role_assignments WHERE role_id = %s GROUP BY status",
            (archived,),
        ).fetchall()
        role_status = conn.execute(
            "SELECT status FROM identity.role_definitions WHERE id = %s", (archived,)
        ).fetchone()
    assert statuses == [("Revoked", 3)]
    assert role_status == ("Archived",)
    assert not [e for e in tap.read_to_end(_for(bystander)) if e.payload["changeReason"] == "RoleArchived"]
    with pytest.raises(ConflictError):
        seed.grant(stores.identity_transactions, bystander, archived, company_id)


@pytest.mark.parametrize(("members", "expected"), [(3, FanOutPath.INLINE), (4, FanOutPath.QUEUED)])
def test_set_permissions_inline_up_to_the_threshold_and_queued_above(
    container: Container, stores: Stores, tap: EventTap, database_url: str, members: int, expected: FanOutPath
) -> None:
    company_id = seed.company(stores.identity_transactions)
    role_id = seed.role(stores.identity_transactions, company_id)
    users = [seed.user(stores.identity_transactions, company_id) for _ in range(members)]
    for user_id in users:
        seed.grant(stores.identity_transactions, user_id, role_id, company_id)
    # A second assignment of the same role must not count its user twice.
    seed.grant_in(
        stores.identity_transactions, users[0], role_id, Scope(ScopeType.PROJECT, project_id=uuid.uuid4())
    )

    change = seed.change_permissions(
        stores.identity_transactions,
        role_id,
        ["deals.read", "deals.write"],
        FanOutPolicy(inline_threshold=3),
    )
    publish_outbox(container)

    assert change.path is expected and change.role_version == 2
    with psycopg.connect(database_url) as conn:
        tasks = conn.execute(
            "SELECT id, role_id, company_id, role_version, reason, status, cursor, processed_count,"
            " attempt_count FROM identity.access_fanout_tasks"
        ).fetchall()
        codes = conn.execute(
            "SELECT permission_code FROM identity.role_permissions WHERE role_id = %s ORDER BY 1",
            (role_id,),
        ).fetchall()
    assert codes == [("deals.read",), ("deals.write",)]

    def changed(e: ConsumedEvent) -> bool:
        return (
            e.body["eventType"] == "UserAccessChanged"
            and e.payload["changeReason"] == "RolePermissionsChanged"
            and e.payload["changedRoleId"] == str(role_id)
        )

    if expected is FanOutPath.INLINE:
        assert tasks == [] and change.users_notified_inline == 3
        events = tap.wait_for(changed, 3)
        assert sorted(e.key for e in events) == sorted(str(u) for u in users)
        assert {e.payload["version"] for e in events} == {2}
        assert {e.payload["changedRoleId"] for e in events} == {str(role_id)}
    else:
        assert tasks == [
            (change.task_id, role_id, company_id, 2, "RolePermissionsChanged", "Pending", None, 0, 0)
        ]
        assert tap.settle(changed, quiet_s=0.5) == []


def test_pending_fanout_tasks_coalesce_to_the_newest_version(stores: Stores, database_url: str) -> None:
    company_id = seed.company(stores.identity_transactions)
    role_id = seed.role(stores.identity_transactions, company_id)
    for user_id in [seed.user(stores.identity_transactions, company_id) for _ in range(2)]:
        seed.grant(stores.identity_transactions, user_id, role_id, company_id)
    policy = FanOutPolicy(inline_threshold=1)
    first = seed.change_permissions(stores.identity_transactions, role_id, ["a"], policy)
    second = seed.change_permissions(stores.identity_transactions, role_id, ["b"], policy)
    assert first.task_id == second.task_id
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT status, role_version FROM identity.access_fanout_tasks").fetchall()
        version = conn.execute(
            "SELECT version FROM identity.role_definitions WHERE id = %s", (role_id,)
        ).fetchone()
    assert rows == [("Pending", 3)]
    assert version == (3,)


def test_granting_a_role_the_user_already_holds_in_that_scope_is_a_conflict(stores: Stores) -> None:
    company = seed.company(stores.identity_transactions)
    role = seed.role(stores.identity_transactions, company)
    user = seed.user(stores.identity_transactions, company)
    seed.grant(stores.identity_transactions, user, role, company)
    with pytest.raises(ConflictError, match="already holds"):
        seed.grant(stores.identity_transactions, user, role, company)

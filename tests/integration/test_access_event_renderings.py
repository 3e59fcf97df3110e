"""UserAccessChanged is rendered at three sites (pin_identity.domain.events names them and says why): for the
same user and the same change, all three must write the same event, field for field and key for key, and
each must satisfy the event's JSON Schema. The bytes may differ in whitespace only (the SQL rendering of
activeAssignments puts a space after `,` and `:`): consumers parse the JSON and the access audit compares
canonical forms, so whitespace is not part of the contract."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.outbox_writer import template_params
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain import events
from pin_identity.domain.events import AccessChange, OutboxMessage
from pin_identity.domain.model import AccessChangeReason, CompanyType, Scope, ScopeType, UserType
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from tests.support import seed
from tests.support.schemas import validate_event


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    """Only the database: every rendering under test ends in the outbox, so no broker is started."""
    return Settings(database_url=database_url, data_dir=tmp_path)


def _user_with_every_kind_of_assignment(container: Container) -> tuple[UUID, UUID]:
    """A user of a company holding a global role and company roles in each scope, two of them expiring (one
    on a whole second), one revoked; names and role codes carry Cyrillic, quotes, a backslash and `%`."""
    ctx = partial(Context.fresh, SYSTEM_CLOCK)
    company_id = identity_changes.create_company(
        container.stores.identity_transactions,
        ctx(),
        name='Стройинвест «Дом» "Ёж"',
        company_type=CompanyType.DEVELOPER,
    )
    user_id = identity_changes.create_user(
        container.stores.identity_transactions,
        ctx(),
        identity_changes.NewUser(
            phone=seed.next_phone(),
            first_name="Иван",
            last_name="Пётр\\ов %s",
            middle_name='Сергеевич "мл."',
            type=UserType.DEVELOPER_MANAGER,
            company_id=company_id,
        ),
    )
    global_role = seed.role(container.stores.identity_transactions, None, "platform-админ")
    company_role = seed.role(container.stores.identity_transactions, company_id, 'sales "менеджер" \\ 100%s')
    project_role = seed.role(container.stores.identity_transactions, company_id, "прораб-%")
    grants: list[tuple[UUID, Scope, datetime | None]] = [
        (global_role, Scope(ScopeType.PLATFORM), None),
        (company_role, Scope.organization(company_id), None),
        (
            company_role,
            Scope(ScopeType.PROJECT_GROUP, project_group_id=uuid.uuid4()),
            datetime(2027, 3, 1, 9, 30, 15, 123456, tzinfo=UTC),
        ),
        (
            project_role,
            Scope(ScopeType.PROJECT, project_id=uuid.uuid4()),
            datetime(2030, 1, 1, tzinfo=UTC),
        ),
        (project_role, Scope(ScopeType.PROJECT, project_id=uuid.uuid4()), None),
    ]
    assignments = [
        identity_changes.grant_role_assignment(
            container.stores.identity_transactions,
            ctx(),
            user_id=user_id,
            role_id=role_id,
            scope=scope,
            expires_at=expires,
        )
        for role_id, scope, expires in grants
    ]
    identity_changes.revoke_role_assignment(container.stores.identity_transactions, ctx(), assignments[-1])
    return user_id, company_role


def _user_without_company_or_assignments(container: Container) -> UUID:
    """A user of no company whose one assignment was revoked (the import announces revocations too)."""
    ctx = partial(Context.fresh, SYSTEM_CLOCK)
    user_id = identity_changes.create_user(
        container.stores.identity_transactions,
        ctx(),
        identity_changes.NewUser(phone=seed.next_phone(), first_name="Ёлка", last_name="Ünïcödé"),
    )
    role_id = seed.role(container.stores.identity_transactions, None, "гость")
    scope = Scope(ScopeType.PLATFORM)
    assignment = identity_changes.grant_role_assignment(
        container.stores.identity_transactions, ctx(), user_id=user_id, role_id=role_id, scope=scope
    )
    identity_changes.revoke_role_assignment(container.stores.identity_transactions, ctx(), assignment)
    return user_id


def _by_python(container: Container, user_id: UUID, change: AccessChange) -> OutboxMessage:
    """Point changes: typed snapshot, activeAssignments and envelope encoded in Python."""
    with container.stores.identity_transactions() as tx:
        [snapshot] = tx.access_snapshots([user_id])
    return events.user_access_changed(snapshot, **change)


def _by_sql_assignments(container: Container, user_id: UUID, change: AccessChange) -> OutboxMessage:
    """The import's apply: activeAssignments from rendered_access_snapshots, envelope filled in Python."""
    with container.stores.replica_transactions() as tx:
        rendered, _version = tx.access_changes([user_id])[user_id]
    return events.rendered_access_changed(rendered, **change)


def _by_sql(database_url: str, user_id: UUID, change: AccessChange) -> OutboxMessage:
    """The fan-out's page: write_access_changes renders and writes the whole event in the database."""
    template = events.access_changed_template(**change)
    with psycopg.connect(database_url) as conn:
        conn.execute(query("write_access_changes"), {"user_ids": [user_id], **template_params(template)})
        written = conn.execute(
            "SELECT event_id, topic, message_key, event_type, correlation_id, traceparent, value"
            " FROM identity.outbox_events WHERE correlation_id = %s",
            (template.correlation_id,),
        ).fetchall()
        conn.rollback()
    [(event_id, topic, key, event_type, correlation_id, traceparent, value)] = written
    return OutboxMessage(event_id, topic, key, event_type, correlation_id, value, traceparent)


def _wire(message: OutboxMessage) -> tuple[Any, ...]:
    """What a consumer sees, key order included; the event id (random at each site) set aside once checked."""
    body = json.loads(message.value)
    validate_event(body)
    assert body["eventId"] == str(message.event_id)
    value = message.value.replace(str(message.event_id), "event-id")
    ordered = json.loads(value, object_pairs_hook=list)
    return (
        message.topic,
        message.key,
        message.event_type,
        message.correlation_id,
        message.traceparent,
        ordered,
    )


def test_the_three_renderings_of_user_access_changed_are_identical(
    container: Container, database_url: str
) -> None:
    user_id, company_role = _user_with_every_kind_of_assignment(container)
    loner = _user_without_company_or_assignments(container)
    change = AccessChange(
        reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
        version=7,
        changed_role_id=company_role,
        correlation_id=uuid.uuid4(),
        occurred_at=datetime(2026, 12, 2, 1, 2, 3, 456789, tzinfo=UTC),
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    for user in (user_id, loner):
        python = _wire(_by_python(container, user, change))
        sql_assignments = _wire(_by_sql_assignments(container, user, change))
        sql = _wire(_by_sql(database_url, user, change))
        assert sql_assignments == python, "rendered_access_snapshots and events._assignments disagree"
        assert sql == python, "write_access_changes and AccessChangeTemplate.fill disagree"

    body = json.loads(_by_python(container, user_id, change).value)
    held = body["payload"]["activeAssignments"]
    assert sorted(a["scopeType"] for a in held) == ["Organization", "Platform", "Project", "ProjectGroup"]
    assert {a["expiresAt"] for a in held} == {
        None,
        "2027-03-01T09:30:15.123456Z",
        "2030-01-01T00:00:00.000000Z",
    }
    alone = json.loads(_by_python(container, loner, change).value)["payload"]
    assert (alone["companyId"], alone["activeAssignments"]) == (None, [])

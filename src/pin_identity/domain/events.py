"""The events we publish (CONTRACTS section 4), built as outbox messages ready for the wire."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pin_identity.domain.model import AccessChangeReason, RenderedAccessSnapshot, UserAccessSnapshot

CONTRACT_VERSION = 1

ACCESS_TOPIC = "pin.identity.access.v1"
COMPANIES_TOPIC = "pin.identity.companies.v1"
USERS_TOPIC = "pin.identity.users.v1"
PUBLISHED_TOPICS = (ACCESS_TOPIC, COMPANIES_TOPIC, USERS_TOPIC)

# One encoder for every event: json.dumps with options would build a new one per call (a hot path).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# Stands in for the pre-rendered activeAssignments while the rest of the body is encoded; every other
# value of the body is a uuid, a timestamp, an enum name or a number, so it cannot occur elsewhere.
_RENDERED_ASSIGNMENTS = "\u0000rendered-active-assignments\u0000"
_RENDERED_ASSIGNMENTS_ENCODED = json.dumps(_RENDERED_ASSIGNMENTS)


@dataclass(frozen=True)
class OutboxMessage:
    """One event as the relay will send it: topic, key, headers and the serialized envelope."""

    event_id: UUID
    topic: str
    key: str
    event_type: str
    correlation_id: UUID
    value: str
    traceparent: str | None = None


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _uuid_or_none(value: UUID | None) -> str | None:
    return str(value) if value is not None else None


@dataclass(frozen=True)
class _Stamp:
    """What every event of one operation or batch shares, rendered to text once."""

    correlation_id: UUID
    correlation: str
    occurred: str
    traceparent: str | None

    @classmethod
    def of(cls, correlation_id: UUID, occurred_at: datetime, traceparent: str | None) -> _Stamp:
        return cls(correlation_id, str(correlation_id), _iso(occurred_at), traceparent)


def _message(
    stamp: _Stamp,
    *,
    event_type: str,
    topic: str,
    aggregate_type: str,
    aggregate_id: str,
    payload: dict[str, Any],
    rendered_assignments: str | None = None,
) -> OutboxMessage:
    event_id = uuid.uuid4()
    body = {
        "eventId": str(event_id),
        "eventType": event_type,
        "contractVersion": CONTRACT_VERSION,
        "aggregateType": aggregate_type,
        "aggregateId": aggregate_id,
        "occurredAt": stamp.occurred,
        "correlationId": stamp.correlation,
        "payload": payload,
    }
    value = _ENCODER.encode(body)
    if rendered_assignments is not None:
        value = value.replace(_RENDERED_ASSIGNMENTS_ENCODED, rendered_assignments, 1)
    return OutboxMessage(
        event_id=event_id,
        topic=topic,
        key=aggregate_id,
        event_type=event_type,
        correlation_id=stamp.correlation_id,
        value=value,
        traceparent=stamp.traceparent,
    )


def envelope(
    *,
    event_type: str,
    topic: str,
    aggregate_type: str,
    aggregate_id: UUID,
    payload: dict[str, Any],
    correlation_id: UUID,
    occurred_at: datetime,
    traceparent: str | None = None,
) -> OutboxMessage:
    return _message(
        _Stamp.of(correlation_id, occurred_at, traceparent),
        event_type=event_type,
        topic=topic,
        aggregate_type=aggregate_type,
        aggregate_id=str(aggregate_id),
        payload=payload,
    )


def _assignments(snapshot: UserAccessSnapshot) -> list[dict[str, Any]]:
    return [
        {
            "assignmentId": str(item.assignment_id),
            "roleId": str(item.role_id),
            "roleCode": item.role_code,
            "scopeType": item.scope.type.value,
            "scopeOrganizationId": _uuid_or_none(item.scope.organization_id),
            "scopeProjectGroupId": _uuid_or_none(item.scope.project_group_id),
            "scopeProjectId": _uuid_or_none(item.scope.project_id),
            "expiresAt": _iso(item.expires_at) if item.expires_at else None,
        }
        for item in sorted(snapshot.assignments, key=lambda a: a.assignment_id)
    ]


@dataclass(frozen=True)
class _AccessChange:
    """What every UserAccessChanged of one operation or page shares."""

    stamp: _Stamp
    reason: AccessChangeReason
    version: int
    changed_role_id: str

    def event(
        self, user_id: UUID, company_id: UUID | None, assignments: list[dict[str, Any]] | str
    ) -> OutboxMessage:
        """`assignments` as a list, or as the JSON text of that list already rendered by the database."""
        user = str(user_id)
        payload = {
            "userId": user,
            "companyId": _uuid_or_none(company_id),
            "changeReason": self.reason.value,
            "version": self.version,
            "changedRoleId": self.changed_role_id,
            "activeAssignments": _RENDERED_ASSIGNMENTS if isinstance(assignments, str) else assignments,
        }
        return _message(
            self.stamp,
            event_type="UserAccessChanged",
            topic=ACCESS_TOPIC,
            aggregate_type="User",
            aggregate_id=user,
            payload=payload,
            rendered_assignments=assignments if isinstance(assignments, str) else None,
        )


def rendered_access_changed(
    snapshots: Iterable[RenderedAccessSnapshot],
    *,
    reason: AccessChangeReason,
    version: int,
    changed_role_id: UUID,
    correlation_id: UUID,
    occurred_at: datetime,
    traceparent: str | None = None,
) -> list[OutboxMessage]:
    """user_access_changed for snapshots the database rendered (the fan-out's page query, its hot path)."""
    change = _AccessChange(
        _Stamp.of(correlation_id, occurred_at, traceparent), reason, version, str(changed_role_id)
    )
    return [change.event(s.user_id, s.company_id, s.assignments_json) for s in snapshots]


def user_access_changed(
    snapshot: UserAccessSnapshot,
    *,
    reason: AccessChangeReason,
    version: int,
    changed_role_id: UUID,
    correlation_id: UUID,
    occurred_at: datetime,
    traceparent: str | None = None,
) -> OutboxMessage:
    """UserAccessChanged with the user's full snapshot (point changes, inline announcements)."""
    change = _AccessChange(
        _Stamp.of(correlation_id, occurred_at, traceparent), reason, version, str(changed_role_id)
    )
    return change.event(snapshot.user_id, snapshot.company_id, _assignments(snapshot))


@dataclass(frozen=True)
class CompanyState:
    """A company as CompanyUpserted describes it."""

    company_id: UUID
    name: str
    company_type: str
    status: str
    tax_id: str | None
    sync_source: str
    external_talent_tenant_id: UUID | None
    replica_version: int | None


@dataclass(frozen=True)
class UserState:
    """A user as UserUpserted describes it (carries contacts: the users topic is the one place for PII)."""

    user_id: UUID
    company_id: UUID | None
    type: str
    status: str
    phone: str
    email: str | None
    first_name: str
    last_name: str
    middle_name: str | None
    contacts_managed_by: str
    sync_source: str
    external_talent_user_id: UUID | None
    replica_version: int | None


def company_upserted(company: CompanyState, *, correlation_id: UUID, occurred_at: datetime) -> OutboxMessage:
    payload = {
        "companyId": str(company.company_id),
        "name": company.name,
        "companyType": company.company_type,
        "status": company.status,
        "taxId": company.tax_id,
        "syncSource": company.sync_source,
        "externalTalentTenantId": _uuid_or_none(company.external_talent_tenant_id),
        "replicaVersion": company.replica_version,
    }
    return envelope(
        event_type="CompanyUpserted",
        topic=COMPANIES_TOPIC,
        aggregate_type="Company",
        aggregate_id=company.company_id,
        payload=payload,
        correlation_id=correlation_id,
        occurred_at=occurred_at,
    )


def user_upserted(user: UserState, *, correlation_id: UUID, occurred_at: datetime) -> OutboxMessage:
    payload = {
        "userId": str(user.user_id),
        "companyId": _uuid_or_none(user.company_id),
        "type": user.type,
        "status": user.status,
        "phone": user.phone,
        "email": user.email,
        "firstName": user.first_name,
        "lastName": user.last_name,
        "middleName": user.middle_name,
        "contactsManagedBy": user.contacts_managed_by,
        "syncSource": user.sync_source,
        "externalTalentUserId": _uuid_or_none(user.external_talent_user_id),
        "replicaVersion": user.replica_version,
    }
    return envelope(
        event_type="UserUpserted",
        topic=USERS_TOPIC,
        aggregate_type="User",
        aggregate_id=user.user_id,
        payload=payload,
        correlation_id=correlation_id,
        occurred_at=occurred_at,
    )


def now_utc() -> datetime:
    return datetime.now(UTC)

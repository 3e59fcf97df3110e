"""The events we publish (CONTRACTS section 4), built as outbox messages ready for the wire.

UserAccessChanged is rendered at three sites; this module owns its shape. `access_changed_template` is the
envelope with its payload (userId, companyId, changeReason, version, changedRoleId, activeAssignments),
encoded once per operation or page with slots for what differs per user (`EnvelopeSlot`); `_assignments` is
one entry of activeAssignments (assignmentId, roleId, roleCode, scopeType, scopeOrganizationId,
scopeProjectGroupId, scopeProjectId, expiresAt: ids as lowercase text or null, expiresAt in UTC with
microseconds and `Z`), sorted by assignmentId. The sites (blocks of the SQL files in adapters/postgres/:
`access_snapshots` in identity_store.sql, `rendered_access_snapshots` in access_rendering.sql,
`write_access_changes` in fanout_queue.sql):

1. `user_access_changed`: point changes, inline announcements (operations/identity_changes.py) and the
   managers of a company blocked or restored by Talent (operations/talent_writes.py) fill the template in
   Python from a typed snapshot (block `access_snapshots`). Not a measured path: the readable reference,
   and what unit tests and benchmarks build events with.
2. `rendered_access_changed` over block `rendered_access_snapshots`: the import's apply
   (bench/talent_apply.py) has the database render activeAssignments as JSON text, so it does no
   per-assignment Python work; each user's event carries that user's version and follows their
   UserUpserted, so the envelope is still filled here.
3. Block `write_access_changes`, the template handed over by adapters/postgres/outbox_writer.template_params:
   the fan-out page (bench/access_fanout.py) has the database fill the slots with format() and insert the
   rows, so no envelope passes through the client.

`rendered_access_snapshots` restates `_assignments` in SQL (its separators carry spaces: consumers read the
JSON, and the audit compares canonical forms), `write_access_changes` restates `AccessChangeTemplate.fill`.
A change to the shape changes them together: tests/integration/test_access_event_renderings.py holds the
three sites to the same JSON for the same user, key order included, and to schemas/events/.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import lru_cache
from typing import Any, NotRequired, TypedDict, Unpack
from uuid import UUID

import orjson

from pin_identity.domain.model import AccessChangeReason, RenderedAccessSnapshot, UserAccessSnapshot

CONTRACT_VERSION = 1

ACCESS_TOPIC = "pin.identity.access.v1"
COMPANIES_TOPIC = "pin.identity.companies.v1"
USERS_TOPIC = "pin.identity.users.v1"
PUBLISHED_TOPICS = (ACCESS_TOPIC, COMPANIES_TOPIC, USERS_TOPIC)


class _Kind(TypedDict):
    """Which event a message is: its type, its topic and the type of the aggregate it describes."""

    event_type: str
    topic: str
    aggregate_type: str


_COMPANY_UPSERTED = _Kind(event_type="CompanyUpserted", topic=COMPANIES_TOPIC, aggregate_type="Company")
_USER_UPSERTED = _Kind(event_type="UserUpserted", topic=USERS_TOPIC, aggregate_type="User")
_USER_ACCESS_CHANGED = _Kind(event_type="UserAccessChanged", topic=ACCESS_TOPIC, aggregate_type="User")

# The events' JSON: compact, non-ASCII as is. orjson writes exactly what this stdlib encoder writes for what
# events hold (text, integers, booleans, null, lists, objects; tests/unit/test_domain.py holds the two equal),
# several times faster, and the import's apply encodes one UserUpserted per user. What orjson refuses (text
# with a lone surrogate, an integer past 64 bits) the stdlib encoder writes, as before.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _encode(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return _ENCODER.encode(value)


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

    @staticmethod
    @lru_cache(maxsize=16)
    def of(correlation_id: UUID, occurred_at: datetime, traceparent: str | None) -> _Stamp:
        """The events of one operation or page share their stamp: it is rendered once, not once an event."""
        return _Stamp(correlation_id, str(correlation_id), _iso(occurred_at), traceparent)


def _message(stamp: _Stamp, kind: _Kind, aggregate_id: str, payload: dict[str, Any]) -> OutboxMessage:
    event_id = uuid.uuid4()
    value = _encode(_body(stamp, kind, str(event_id), aggregate_id, payload))
    return OutboxMessage(
        event_id=event_id,
        topic=kind["topic"],
        key=aggregate_id,
        event_type=kind["event_type"],
        correlation_id=stamp.correlation_id,
        value=value,
        traceparent=stamp.traceparent,
    )


def _body(
    stamp: _Stamp, kind: _Kind, event_id: str, aggregate_id: str, payload: dict[str, Any]
) -> dict[str, Any]:
    return {
        "eventId": event_id,
        "eventType": kind["event_type"],
        "contractVersion": CONTRACT_VERSION,
        "aggregateType": kind["aggregate_type"],
        "aggregateId": aggregate_id,
        "occurredAt": stamp.occurred,
        "correlationId": stamp.correlation,
        "payload": payload,
    }


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
    kind = _Kind(event_type=event_type, topic=topic, aggregate_type=aggregate_type)
    return _message(_Stamp.of(correlation_id, occurred_at, traceparent), kind, str(aggregate_id), payload)


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


class EnvelopeSlot(StrEnum):
    """What differs from user to user in the UserAccessChanged events of one operation or page; each slot
    takes a JSON value in wire form (a quoted uuid, `null`, the activeAssignments array)."""

    EVENT_ID = "eventId"
    USER_ID = "userId"
    COMPANY_ID = "companyId"
    ACTIVE_ASSIGNMENTS = "activeAssignments"


def _slot_marker(slot: EnvelopeSlot) -> str:
    # The encoder escapes NUL, so a marker's encoded form cannot be produced by any real value of the body
    # (every other value is a uuid, a timestamp, an enum name or a number).
    return f"\u0000slot:{slot.value}\u0000"


_ENCODED_SLOT = re.compile(r'"\\u0000slot:([A-Za-z]+)\\u0000"')


@dataclass(frozen=True)
class AccessChangeTemplate:
    """The UserAccessChanged events of one operation or page, encoded once with their per-user values left as
    slots: `pieces` are the literal text around `slots` (one piece more than slots). `fill` completes one
    event; the fan-out has the database fill a whole page, so no envelope passes through the client."""

    pieces: tuple[str, ...]
    slots: tuple[EnvelopeSlot, ...]
    correlation_id: UUID
    traceparent: str | None
    topic: str = _USER_ACCESS_CHANGED["topic"]
    event_type: str = _USER_ACCESS_CHANGED["event_type"]

    def fill(self, user_id: UUID, company_id: UUID | None, assignments_json: str) -> OutboxMessage:
        event_id = uuid.uuid4()
        values = {
            EnvelopeSlot.EVENT_ID: f'"{event_id}"',
            EnvelopeSlot.USER_ID: f'"{user_id}"',
            EnvelopeSlot.COMPANY_ID: f'"{company_id}"' if company_id is not None else "null",
            EnvelopeSlot.ACTIVE_ASSIGNMENTS: assignments_json,
        }
        parts = [self.pieces[0]]
        for slot, piece in zip(self.slots, self.pieces[1:], strict=True):
            parts += (values[slot], piece)
        return OutboxMessage(
            event_id=event_id,
            topic=self.topic,
            key=str(user_id),
            event_type=self.event_type,
            correlation_id=self.correlation_id,
            value="".join(parts),
            traceparent=self.traceparent,
        )


class AccessChange(TypedDict):
    """What the UserAccessChanged events of one operation or page say besides each user's snapshot."""

    reason: AccessChangeReason
    version: int
    changed_role_id: UUID
    correlation_id: UUID
    occurred_at: datetime
    traceparent: NotRequired[str | None]


# The import's apply renders its users' events one by one, and a page's users share a handful of (reason,
# version, role): each template is encoded once, not once a user. Templates are immutable.
@lru_cache(maxsize=64)
def access_changed_template(
    *,
    reason: AccessChangeReason,
    version: int,
    changed_role_id: UUID,
    correlation_id: UUID,
    occurred_at: datetime,
    traceparent: str | None = None,
) -> AccessChangeTemplate:
    user = _slot_marker(EnvelopeSlot.USER_ID)
    payload = {
        "userId": user,
        "companyId": _slot_marker(EnvelopeSlot.COMPANY_ID),
        "changeReason": reason.value,
        "version": version,
        "changedRoleId": str(changed_role_id),
        "activeAssignments": _slot_marker(EnvelopeSlot.ACTIVE_ASSIGNMENTS),
    }
    stamp = _Stamp.of(correlation_id, occurred_at, traceparent)
    event_id = _slot_marker(EnvelopeSlot.EVENT_ID)
    body = _body(stamp, _USER_ACCESS_CHANGED, event_id, user, payload)
    split = _ENCODED_SLOT.split(_encode(body))
    return AccessChangeTemplate(
        pieces=tuple(split[0::2]),
        slots=tuple(EnvelopeSlot(name) for name in split[1::2]),
        correlation_id=correlation_id,
        traceparent=traceparent,
    )


def rendered_access_changed(
    snapshot: RenderedAccessSnapshot, **change: Unpack[AccessChange]
) -> OutboxMessage:
    """user_access_changed for a snapshot the database rendered (activeAssignments already JSON)."""
    template = access_changed_template(**change)
    return template.fill(snapshot.user_id, snapshot.company_id, snapshot.assignments_json)


def user_access_changed(snapshot: UserAccessSnapshot, **change: Unpack[AccessChange]) -> OutboxMessage:
    """UserAccessChanged with the user's full snapshot (point changes, inline announcements)."""
    assignments = _encode(_assignments(snapshot))
    return access_changed_template(**change).fill(snapshot.user_id, snapshot.company_id, assignments)


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


def company_upserted(
    company: CompanyState, *, correlation_id: UUID, occurred_at: datetime, traceparent: str | None = None
) -> OutboxMessage:
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
    stamp = _Stamp.of(correlation_id, occurred_at, traceparent)
    return _message(stamp, _COMPANY_UPSERTED, str(company.company_id), payload)


def user_upserted(
    user: UserState, *, correlation_id: UUID, occurred_at: datetime, traceparent: str | None = None
) -> OutboxMessage:
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
    stamp = _Stamp.of(correlation_id, occurred_at, traceparent)
    return _message(stamp, _USER_UPSERTED, str(user.user_id), payload)

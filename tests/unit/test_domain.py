from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pin_identity.domain import events
from pin_identity.domain.api_model import ApiModel
from pin_identity.domain.errors import InvalidInputError
from pin_identity.domain.fanout_policy import FanOutPath, FanOutPolicy
from pin_identity.domain.model import (
    AccessChangeReason,
    ActiveAssignment,
    Scope,
    ScopeType,
    UserAccessSnapshot,
    permission_set,
)
from pin_identity.domain.phone import InvalidPhoneError, mask_phone, normalize_phone
from tests.support.schemas import validate_event


@pytest.mark.parametrize("written", ["+7 (912) 345-67-89", "8 912 345 67 89", "9123456789", "+79123456789"])
def test_common_written_forms_normalise_to_e164(written: str) -> None:
    assert normalize_phone(written) == "+79123456789"


@pytest.mark.parametrize("garbage", ["", "call me", "+7 12"])
def test_invalid_phones_are_refused(garbage: str) -> None:
    with pytest.raises(InvalidPhoneError):
        normalize_phone(garbage)


def test_masked_phone_keeps_country_and_last_four() -> None:
    assert mask_phone("+79123451234") == "+7***1234"


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=10_000))
def test_inline_exactly_up_to_the_threshold(threshold: int, users: int) -> None:
    policy = FanOutPolicy(threshold)
    assert (policy.path_for(users) is FanOutPath.INLINE) == (users <= threshold)
    assert policy.path_for(policy.users_to_count) is FanOutPath.QUEUED


def test_user_access_changed_matches_the_contract_and_sorts_assignments() -> None:
    user_id, company_id, role_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    later, earlier = sorted([uuid.uuid4(), uuid.uuid4()], reverse=True)
    expires = datetime(2027, 1, 1, 12, tzinfo=UTC)
    snapshot = UserAccessSnapshot(
        user_id,
        company_id,
        (
            ActiveAssignment(
                later, role_id, "sales", Scope(ScopeType.PROJECT, project_id=uuid.uuid4()), expires
            ),
            ActiveAssignment(earlier, role_id, "sales", Scope.organization(company_id), None),
        ),
    )
    message = events.user_access_changed(
        snapshot,
        reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
        version=7,
        changed_role_id=role_id,
        correlation_id=uuid.uuid4(),
        occurred_at=datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
    )
    body = json.loads(message.value)
    validate_event(body)
    assert (message.topic, message.key, message.event_type) == (
        "pin.identity.access.v1",
        str(user_id),
        "UserAccessChanged",
    )
    assert body["occurredAt"] == "2026-11-29T10:00:00.000000Z"
    assert [a["assignmentId"] for a in body["payload"]["activeAssignments"]] == [str(earlier), str(later)]
    assert body["payload"]["activeAssignments"][1]["expiresAt"] == "2027-01-01T12:00:00.000000Z"
    assert body["payload"]["version"] == 7 and body["payload"]["changedRoleId"] == str(role_id)


def test_a_scope_without_its_id_is_refused() -> None:
    with pytest.raises(ValueError, match="needs its id"):
        Scope(ScopeType.ORGANIZATION)


def test_a_permission_code_of_200_characters_is_taken_and_one_of_201_refused() -> None:
    assert permission_set(["p" * 200]) == ["p" * 200]
    with pytest.raises(InvalidInputError, match="at most 200 characters, not 201"):
        permission_set(["p" * 201])


@pytest.mark.parametrize("codes", [[""], [" "], ["deals.read", "  "]])
def test_an_empty_permission_code_is_refused(codes: list[str]) -> None:
    with pytest.raises(InvalidInputError, match="cannot be empty"):
        permission_set(codes)


@pytest.mark.parametrize("code", ["a\x00b", "deals\tread", "deals.read\n", "\x1f", "a\x7f"])
def test_a_permission_code_with_a_control_character_is_refused(code: str) -> None:
    with pytest.raises(InvalidInputError, match="control character"):
        permission_set([code])


def test_a_role_holds_1000_permission_codes_and_not_1001() -> None:
    assert len(permission_set([f"p{n}" for n in range(1000)])) == 1000
    with pytest.raises(InvalidInputError, match="at most 1000 permission codes, not 1001"):
        permission_set([f"p{n}" for n in range(1001)])


def test_a_permission_set_is_trimmed_deduplicated_and_sorted_and_may_be_empty() -> None:
    assert permission_set([" deals.write", "deals.read ", "deals.read", "élan ✓"]) == [
        "deals.read",
        "deals.write",
        "élan ✓",
    ]
    assert permission_set([]) == []


@pytest.mark.parametrize("company_id", [None, uuid.UUID("6a0c1c1e-2f1b-4a55-9d5e-1f2a3b4c5d6e")])
def test_a_template_fills_in_each_users_values_and_nothing_else(company_id: uuid.UUID | None) -> None:
    role_id, correlation_id, user_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    template = events.access_changed_template(
        reason=AccessChangeReason.ROLE_ASSIGNED,
        version=3,
        changed_role_id=role_id,
        correlation_id=correlation_id,
        occurred_at=datetime(2026, 11, 30, 21, tzinfo=UTC),
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    assert len(template.pieces) == len(template.slots) + 1
    assert not any("slot:" in piece for piece in template.pieces)
    assignments = '[{"assignmentId" : "a", "roleCode" : "code \\"%s\\" 100%"}]'
    message = template.fill(user_id, company_id, assignments)
    assert json.loads(message.value) == {
        "eventId": str(message.event_id),
        "eventType": "UserAccessChanged",
        "contractVersion": 1,
        "aggregateType": "User",
        "aggregateId": str(user_id),
        "occurredAt": "2026-11-30T21:00:00.000000Z",
        "correlationId": str(correlation_id),
        "payload": {
            "userId": str(user_id),
            "companyId": str(company_id) if company_id else None,
            "changeReason": "RoleAssigned",
            "version": 3,
            "changedRoleId": str(role_id),
            "activeAssignments": [{"assignmentId": "a", "roleCode": 'code "%s" 100%'}],
        },
    }
    assert (message.key, message.correlation_id, message.traceparent) == (
        str(user_id),
        correlation_id,
        template.traceparent,
    )
    assert template.fill(user_id, company_id, assignments).event_id != message.event_id


# What the events hold: text (any code point, control characters and lone surrogates included), integers
# (past 64 bits too), booleans, null, and lists and objects of them.
_ANY_TEXT = st.text(st.characters(exclude_categories=()))  # surrogates are left out by default
_EVENT_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_ANY_TEXT, inner, max_size=4),
    max_leaves=20,
)


@given(_EVENT_VALUES)
def test_the_events_encoder_writes_what_the_standard_librarys_writes(value: object) -> None:
    """The fast encoder (orjson, falling back to the standard library for what it refuses) changes no byte of
    an event: the same compact JSON, non-ASCII as is, control characters escaped alike."""
    standard = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert events._encode(value) == standard


def test_the_events_of_one_page_share_a_template() -> None:
    """Encoded once a page, not once a user: one (reason, version, role, operation), one template."""
    role, operation, moment = uuid.uuid4(), uuid.uuid4(), datetime(2026, 12, 3, tzinfo=UTC)

    def template(version: int) -> events.AccessChangeTemplate:
        return events.access_changed_template(
            reason=AccessChangeReason.ROLE_ASSIGNED,
            version=version,
            changed_role_id=role,
            correlation_id=operation,
            occurred_at=moment,
        )

    assert template(3) is template(3)
    assert template(4) is not template(3)
    assert template(4).fill(role, None, "[]").value != template(3).fill(role, None, "[]").value


def test_a_document_renamed_in_python_keeps_its_schema_name() -> None:
    """The admin API's OpenAPI document names a document's schema as clients know it, whatever its class."""

    class RenamedView(ApiModel, schema_name="Renamed"):
        count: int

    class Holder(ApiModel):
        renamed: RenamedView

    schema = Holder.model_json_schema()
    assert schema["properties"]["renamed"] == {"$ref": "#/$defs/Renamed"}
    assert schema["$defs"]["Renamed"]["title"] == "Renamed"
    assert RenamedView.__name__ == "RenamedView" and RenamedView(count=1).model_dump() == {"count": 1}

"""Reading Talent's records at the edge: every input is a JSON value or an Undecodable, then a snapshot or an
InvalidSnapshot with its reason, with whatever ids could be read; nothing raises."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pin_identity.adapters.talent_wire import (
    Undecodable,
    api_item,
    decode_page,
    decode_record,
    read_item,
    split_items,
    topic_item,
)
from pin_identity.domain.talent import ImportStage, InvalidSnapshot, TenantSnapshot, UserSnapshot


def _invalid(stage: ImportStage, key: str | None, value: object) -> str:
    """Why the record is no snapshot."""
    snapshot = read_item(stage, key, value).snapshot
    assert isinstance(snapshot, InvalidSnapshot), snapshot
    return snapshot.reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b'{"version": NaN}', "not valid JSON"),
        (b'{"version": -Infinity}', "not valid JSON"),
        (b'{"version": 1e999}', "not valid JSON"),
        (b'{"version": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
        (b"[" * 20 + b"]" * 20, "deeper than 16"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_what_is_no_snapshot_becomes_undecodable_with_its_reason(value: bytes, reason: str) -> None:
    decoded = decode_record(value)
    assert isinstance(decoded, Undecodable)
    assert reason in decoded.reason


@given(st.binary(max_size=200))
def test_no_bytes_make_decoding_raise(value: bytes) -> None:
    decode_record(value)


def test_a_lone_surrogate_escape_decodes_and_is_refused_by_the_snapshot_rules() -> None:
    tenant = str(uuid.uuid4())
    text = '{"tenantId": "%s", "version": 1, "name": "\\ud800", "companyType": "Bank"}' % tenant  # noqa: UP031
    decoded = decode_record(text.encode())
    assert "invalid Unicode" in _invalid(ImportStage.TENANTS, tenant, decoded)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "N" * 501}, "name is longer than 500"),
        ({"version": 2**63}, "version must be an integer"),
        ({"companyType": "x" * 65}, "companyType is longer"),
    ],
)
def test_snapshot_fields_have_limits(fields: dict[str, object], message: str) -> None:
    tenant = str(uuid.uuid4())
    snapshot = {"tenantId": tenant, "version": 1, "name": "A", "companyType": "Bank", **fields}
    assert message in _invalid(ImportStage.TENANTS, tenant, snapshot)


def test_an_undecodable_record_fails_parsing_with_its_reason() -> None:
    assert "not UTF-8" in _invalid(ImportStage.TENANTS, str(uuid.uuid4()), decode_record(b"\xff"))


def test_a_page_with_a_poison_item_keeps_its_good_items_and_its_cursor() -> None:
    page = decode_page(
        b'{"items": [{"a": 1}, {"b": NaN}, ' + b"[" * 3000 + b"]" * 3000 + b'], "nextCursor": "c2"}'
    )
    assert page["items"][0] == {"a": 1}
    assert isinstance(page["items"][1], Undecodable)
    assert isinstance(page["items"][2], Undecodable)
    assert page["nextCursor"] == "c2"


def test_a_page_that_is_not_json_at_all_is_undecodable_as_a_whole() -> None:
    assert isinstance(decode_page(b"<html>busy</html>"), Undecodable)


def test_items_are_split_on_their_own_commas_only() -> None:
    text = '{"nextCursor": "x", "items": [{"s": "a, ]\\"[b"}, [1, [2]], 3], "other": [4]}'
    assert split_items(text) == (
        ['{"s": "a, ]\\"[b"}', "[1, [2]]", "3"],
        '{"nextCursor": "x", "items": [], "other": [4]}',
    )


# ---------------------------------------------------------------- the item each source hands on


def test_a_topic_record_is_read_once_into_its_snapshot_and_ids() -> None:
    user, tenant = uuid.uuid4(), uuid.uuid4()
    value = json.dumps(
        {"userId": str(user), "tenantId": str(tenant), "version": 3, "phone": "+79123456789",
         "firstName": "Иван", "lastName": "Петров", "isDeleted": False}
    ).encode()  # fmt: skip
    item = topic_item(ImportStage.USERS, str(user).encode(), value)
    assert (item.stage, item.talent_id, item.tenant_id, item.tombstone) == (
        ImportStage.USERS,
        user,
        tenant,
        False,
    )
    assert isinstance(item.snapshot, UserSnapshot) and item.snapshot.version == 3


def test_a_tombstone_has_its_key_for_an_id_and_no_tenant_unless_it_is_one() -> None:
    entity = uuid.uuid4()
    user = topic_item(ImportStage.USERS, str(entity).encode(), None)
    tenant = topic_item(ImportStage.TENANTS, str(entity), None)
    assert (user.tombstone, user.talent_id, user.tenant_id) == (True, entity, None)
    assert (tenant.talent_id, tenant.tenant_id) == (entity, entity)
    assert isinstance(tenant.snapshot, TenantSnapshot) and tenant.snapshot.is_deleted


@pytest.mark.parametrize(
    ("key", "value", "talent_id", "tenant_id"),
    [
        ("not-a-uuid", {"tenantId": "T"}, "T", "T"),  # the key is unreadable: the payload's id
        (None, {"tenantId": "T"}, "T", "T"),  # no key at all
        ("T", {"tenantId": "garbage"}, "T", None),  # the key is the id; the payload names no readable tenant
        ("T", "{not json", "T", "T"),  # no object: the key tells whose it is
        (None, ["a", "list"], None, None),
    ],
)
def test_an_invalid_record_keeps_whatever_ids_can_be_read(
    key: str | None, value: object, talent_id: str | None, tenant_id: str | None
) -> None:
    tenant = uuid.uuid4()
    spell = {"T": str(tenant)}
    if isinstance(value, dict):
        value = {name: spell.get(text, text) for name, text in value.items()}
    item = read_item(ImportStage.TENANTS, spell.get(key, key) if key else None, value)
    expected = (tenant if talent_id else None, tenant if tenant_id else None)
    assert isinstance(item.snapshot, InvalidSnapshot)
    assert (item.talent_id, item.tenant_id) == expected


def test_an_api_item_is_keyed_by_its_own_id_and_anything_else_is_invalid() -> None:
    tenant = uuid.uuid4()
    valid = api_item(
        ImportStage.TENANTS, {"tenantId": str(tenant), "version": 1, "name": "A", "companyType": "Bank"}
    )
    assert isinstance(valid.snapshot, TenantSnapshot) and valid.talent_id == tenant
    for value in (None, 7, "text", [1], Undecodable("the value is not valid JSON", "{")):
        item = api_item(ImportStage.TENANTS, value)
        assert isinstance(item.snapshot, InvalidSnapshot) and item.talent_id is None

"""Decoding Talent's records at the edge: every input is a JSON value or an Undecodable, nothing raises."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pin_identity.adapters.talent_wire import decode_page, decode_record, split_items
from pin_identity.domain.talent import InvalidSnapshotError, RawSnapshot, Undecodable, parse_tenant


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
    with pytest.raises(InvalidSnapshotError, match="invalid Unicode"):
        parse_tenant(RawSnapshot(tenant, decoded))


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
    with pytest.raises(InvalidSnapshotError, match=message):
        parse_tenant(RawSnapshot(tenant, snapshot))


def test_an_undecodable_record_fails_parsing_with_its_reason() -> None:
    with pytest.raises(InvalidSnapshotError, match="not UTF-8"):
        parse_tenant(RawSnapshot(str(uuid.uuid4()), decode_record(b"\xff")))


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

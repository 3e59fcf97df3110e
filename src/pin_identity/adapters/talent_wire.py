"""Talent's records as bytes off the wire, decoded and read once, so that no input can stop a pipeline.

Whatever a topic or the API carries (any bytes, any JSON, any depth, any number) becomes a `TalentItem`:
a snapshot the apply logic decides on, or an `InvalidSnapshot` it quarantines with its reason. This is the one
module that knows the wire's field names (`tenantId`, `isDeleted`, ...). Nothing here raises for bad input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn
from uuid import UUID

from pin_identity.domain.phone import InvalidPhoneError, normalize_phone
from pin_identity.domain.talent import (
    ImportStage,
    InvalidSnapshot,
    TalentItem,
    TenantSnapshot,
    UserSnapshot,
)
from pin_identity.observability.logging import first_line

# A Talent snapshot is a flat object: anything nested deeper is not one, and deep values cost the encoders
# (and PostgreSQL's jsonb) their stack.
MAX_DEPTH = 16


@dataclass(frozen=True)
class Undecodable:
    """A record whose bytes are not a JSON value a snapshot could be read from (not UTF-8, not JSON, NaN,
    a number of thousands of digits, nested too deeply). Quarantined with `reason`; `text` is what came."""

    reason: str
    text: str


# ---------------------------------------------------------------- the items of each source


def topic_item(stage: ImportStage, key: bytes | str | None, value: bytes | None) -> TalentItem:
    """A record of one of Talent's topics (the consumer and TopicReplay)."""
    text_key = key.decode("utf-8", errors="replace") if isinstance(key, bytes) else key
    return read_item(stage, text_key, decode_topic_value(value))


def api_item(stage: ImportStage, value: Any) -> TalentItem:
    """An item of an API page: its own id is its key; anything that is not an object goes to quarantine as
    it came."""
    key = value.get(_ID_FIELDS[stage]) if isinstance(value, dict) else None
    return read_item(stage, str(key) if key is not None else None, value)


def read_item(stage: ImportStage, key: str | None, payload: Any) -> TalentItem:
    """A record from its key (the id as text, None when it has none) and its decoded value (None for a
    tombstone); also a quarantine row read back for another try."""
    try:
        snapshot: TenantSnapshot | UserSnapshot | InvalidSnapshot = _SNAPSHOTS[stage](key, payload)
    except _InvalidSnapshotError as exc:
        snapshot = InvalidSnapshot(str(exc))
    if not isinstance(payload, Mapping):  # a tombstone, or no object: only the key can tell whose it is
        talent_id = _readable(key)
        return TalentItem(
            stage, talent_id, talent_id if stage is ImportStage.TENANTS else None, snapshot, payload
        )
    talent_id = _readable(key) or _readable(payload.get(_ID_FIELDS[stage]))
    return TalentItem(stage, talent_id, _readable(payload.get("tenantId")), snapshot, payload)


def decode_topic_value(value: bytes | None) -> Any:
    """A topic record's value: None only for a tombstone (no value at all), which means deleted."""
    if value is None:
        return None
    decoded = decode_record(value)
    if decoded is None:  # the text `null` is a value, not a tombstone: deleting takes no value at all
        return Undecodable("the value is JSON null, not a snapshot", "null")
    return decoded


def decode_record(value: bytes) -> Any:
    """One record's JSON value, or Undecodable with what was wrong with it."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return Undecodable("the value is not UTF-8 text", value.decode("utf-8", errors="replace"))
    return decode_text(text)


def decode_text(text: str) -> Any:
    try:
        decoded = json.loads(text, parse_constant=_non_finite, parse_float=_finite)
    except RecursionError:
        return Undecodable("the value is nested too deeply", text)
    except ValueError as exc:  # not JSON, NaN/Infinity, an integer of thousands of digits
        return Undecodable(f"the value is not valid JSON ({first_line(exc)[:200]})", text)
    if _depth_exceeds(decoded, MAX_DEPTH):
        return Undecodable(f"the value is nested deeper than {MAX_DEPTH} levels", text)
    return decoded


def decode_page(body: bytes) -> Any:
    """An API page; when the page as a whole cannot be decoded, each item of its `items` array is decoded on
    its own, so that one poison item is quarantined instead of failing the page."""
    whole = decode_record(body)
    if not isinstance(whole, Undecodable):
        return whole
    split = split_items(whole.text)
    if split is None:
        return whole
    items, rest = split
    page = decode_text(rest)
    if not isinstance(page, dict):
        return whole
    page["items"] = [decode_text(item) for item in items]
    return page


def split_items(text: str) -> tuple[list[str], str] | None:
    """The elements of the top-level object's `items` array as text, and the object with `[]` in their place;
    None when the text is not shaped so. Scans iteratively: no depth can exhaust the stack."""
    start = _items_array_start(text)
    if start is None:
        return None
    elements, end = _array_elements(text, start)
    if end is None:
        return None
    return elements, text[:start] + "[]" + text[end:]


def _items_array_start(text: str) -> int | None:
    """Where the `[` of the top-level `"items"` member is."""
    depth, i, key_end = 0, 0, -1
    while i < len(text):
        char = text[i]
        if char == '"':
            end = _string_end(text, i)
            if end is None:
                return None
            if depth == 1 and text[i:end] == '"items"':
                key_end = end
            i = end
            continue
        if char in "{[":
            if depth == 1 and char == "[" and key_end >= 0 and text[key_end:i].strip() == ":":
                return i
            depth += 1
        elif char in "}]":
            depth -= 1
        i += 1
    return None


def _array_elements(text: str, start: int) -> tuple[list[str], int | None]:
    """The elements of the array opening at `start`, and the index just after its `]`."""
    elements: list[str] = []
    depth, i, element_start = 0, start, start + 1
    while i < len(text):
        char = text[i]
        if char == '"':
            end = _string_end(text, i)
            if end is None:
                return elements, None
            i = end
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                last = text[element_start:i].strip()
                if last:
                    elements.append(last)
                return elements, i + 1
        elif char == "," and depth == 1:
            elements.append(text[element_start:i].strip())
            element_start = i + 1
        i += 1
    return elements, None


def _string_end(text: str, start: int) -> int | None:
    """The index after the closing quote of the string that opens at `start`."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    return None


def _depth_exceeds(value: Any, limit: int) -> bool:
    pending = [(value, 1)]
    while pending:
        current, depth = pending.pop()
        if depth > limit:
            return True
        if isinstance(current, dict):
            pending.extend((child, depth + 1) for child in current.values())
        elif isinstance(current, list):
            pending.extend((child, depth + 1) for child in current)
    return False


def _finite(literal: str) -> float:
    number = float(literal)
    if math.isinf(number):  # 1e999: valid JSON, but no JSON value (or jsonb) can hold the result
        raise ValueError("a number is out of range")
    return number


def _non_finite(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not a JSON number")


# ---------------------------------------------------------------- reading a snapshot's fields

_ID_FIELDS = {ImportStage.TENANTS: "tenantId", ImportStage.USERS: "userId"}
# The longest value each text field may hold: beyond it a snapshot is not a plausible company or person (and
# its event could not be published: a broker refuses records over about 1 MB).
FIELD_LIMITS = {
    "name": 500,
    "companyType": 64,
    "taxId": 64,
    "phone": 64,
    "email": 320,
    "firstName": 200,
    "lastName": 200,
    "middleName": 200,
}
_MAX_VERSION = 2**63 - 1  # the replica keeps versions as bigint


class _InvalidSnapshotError(ValueError):
    """The record is not a snapshot of the contract's shape."""


def _tenant(key: str | None, payload: Any) -> TenantSnapshot:
    tenant_id, version, fields = _identify(key, payload, "tenantId")
    if fields is None:
        return TenantSnapshot(tenant_id, version, is_deleted=True)
    return TenantSnapshot(
        tenant_id,
        version,
        is_deleted=False,
        name=_text(fields, "name") or "",
        company_type=_text(fields, "companyType") or "",
        tax_id=_text(fields, "taxId", optional=True),
    )


def _user(key: str | None, payload: Any) -> UserSnapshot:
    user_id, version, fields = _identify(key, payload, "userId")
    if fields is None:
        return UserSnapshot(user_id, version, is_deleted=True)
    try:
        phone = normalize_phone(_text(fields, "phone") or "")
    except InvalidPhoneError as exc:
        raise _InvalidSnapshotError(f"phone: {exc}") from None
    return UserSnapshot(
        user_id,
        version,
        is_deleted=False,
        tenant_id=_uuid(fields.get("tenantId"), "tenantId"),
        phone=phone,
        email=_text(fields, "email", optional=True),
        first_name=_text(fields, "firstName") or "",
        last_name=_text(fields, "lastName") or "",
        middle_name=_text(fields, "middleName", optional=True),
    )


_SNAPSHOTS: dict[ImportStage, Callable[[str | None, Any], TenantSnapshot | UserSnapshot]] = {
    ImportStage.TENANTS: _tenant,
    ImportStage.USERS: _user,
}


def _identify(
    key: str | None, payload: Any, id_field: str
) -> tuple[UUID, int | None, Mapping[str, Any] | None]:
    """The record's id, checked against the key, its version and its fields: no fields for a deletion (a
    tombstone, without a version, or a snapshot marked isDeleted)."""
    if payload is None:
        return _uuid(key, "key"), None, None
    if isinstance(payload, Undecodable):
        raise _InvalidSnapshotError(payload.reason)
    if not isinstance(payload, Mapping):
        raise _InvalidSnapshotError("the snapshot is not a JSON object")
    entity_id = _uuid(payload.get(id_field), id_field)
    if key is not None and _uuid(key, "key") != entity_id:
        raise _InvalidSnapshotError(f"the record key does not match {id_field}")
    version, deleted = _version(payload), _is_deleted(payload)
    return entity_id, version, None if deleted else payload


def _uuid(value: Any, field: str) -> UUID:
    if value is None:
        raise _InvalidSnapshotError(f"{field} is missing")
    parsed = _readable(value)
    if parsed is None:
        raise _InvalidSnapshotError(f"{field} is not a uuid")
    return parsed


def _readable(value: Any) -> UUID | None:
    try:
        return UUID(str(value)) if value is not None else None
    except ValueError:
        return None


def _text(fields: Mapping[str, Any], field: str, *, optional: bool = False) -> str | None:
    value = fields.get(field)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _InvalidSnapshotError(f"{field} must be a non-empty string")
    if len(value) > FIELD_LIMITS[field]:
        raise _InvalidSnapshotError(f"{field} is longer than {FIELD_LIMITS[field]} characters")
    if any(ord(char) < 32 or 0xD800 <= ord(char) <= 0xDFFF for char in value):
        # Control characters and lone surrogates (valid JSON escapes) cannot be stored as text.
        raise _InvalidSnapshotError(f"{field} contains control characters or invalid Unicode")
    return value.strip()


def _version(fields: Mapping[str, Any]) -> int:
    version = fields.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= _MAX_VERSION:
        raise _InvalidSnapshotError("version must be an integer from 1 to 2^63-1")
    return version


def _is_deleted(fields: Mapping[str, Any]) -> bool:
    flag = fields.get("isDeleted", False)
    if not isinstance(flag, bool):
        raise _InvalidSnapshotError("isDeleted must be a boolean")
    return flag

"""Talent's records as bytes off the wire, decoded so that no input can stop a pipeline.

Whatever a topic or the API carries (any bytes, any JSON, any depth, any number) becomes either a JSON value
a snapshot can be read from, or an `Undecodable` that the apply logic quarantines with its reason. Nothing
here raises for bad input.
"""

from __future__ import annotations

import json
import math
from typing import Any, NoReturn

from pin_identity.domain.talent import Undecodable

# A Talent snapshot is a flat object: anything nested deeper is not one, and deep values cost the encoders
# (and PostgreSQL's jsonb) their stack.
MAX_DEPTH = 16


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
        return Undecodable(f"the value is not valid JSON ({_first_line(exc)})", text)
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


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]

"""Distinct Russian mobile numbers for test data: one counter, so no two users of a test share a phone."""

from __future__ import annotations

import itertools

_numbers = itertools.count()


def next_phone() -> str:
    """A new number in E.164, as the identity tables store it."""
    return f"+7912{next(_numbers):07d}"


def written_phone() -> str:
    """A new number written the way people write it (Talent sends phones in such forms)."""
    digits = f"{next(_numbers):07d}"
    return f"8 (912) {digits[:3]}-{digits[3:5]}-{digits[5:]}"

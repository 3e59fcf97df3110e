"""normalize_phone's shortcut for the shapes Talent writes must agree with phonenumbers on every input."""

from __future__ import annotations

import phonenumbers
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pin_identity.domain.phone import InvalidPhoneError, normalize_phone


def reference(raw: str) -> str | None:
    """What phonenumbers alone makes of the text (None: not a valid number)."""
    try:
        parsed = phonenumbers.parse(raw, "RU")
    except phonenumbers.NumberParseException:
        return None
    if not phonenumbers.is_valid_number(parsed):
        return None
    return str(phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164))


def normalized(raw: str) -> str | None:
    try:
        return normalize_phone(raw)
    except InvalidPhoneError:
        return None


def _shapes(digits: str) -> list[str]:
    """The shapes Talent writes, and near misses of them, around a run of digits of any length."""
    a, b, c, d = digits[:3], digits[3:6], digits[6:8], digits[8:]
    return [
        digits,
        f"+7{digits}",
        f"7{digits}",
        f"8{digits}",
        f"+8{digits}",
        f"+77{digits}",
        f"8 {a} {b} {c} {d}",
        f"+7 ({a}) {b}-{c}-{d}",
        f"7 ({a}) {b}-{c}-{d}",
        f"8 ({a}) {b}-{c}-{d}",
        f"+7 {a} {b} {c} {d}",
        f"8{a} {b} {c} {d}",
        f"+7 ({a}){b}-{c}-{d}",
        f" +7{digits}",
        f"+7{digits} ",
    ]


@settings(max_examples=3000, deadline=None)
@given(digits=st.text(alphabet="0123456789", min_size=8, max_size=12), shape=st.integers(0, 14))
@example(digits="9123456789", shape=0)
@example(digits="8005553535", shape=0)  # a national number that starts with the national prefix
@example(digits="8101234567", shape=0)  # ... and with the international prefix 810
@example(digits="7012345678", shape=0)  # ... and with the country code (Kazakhstan's numbers)
@example(digits="3012345678", shape=6)
@example(digits="4951234567", shape=7)
def test_every_written_shape_normalises_as_phonenumbers_does(digits: str, shape: int) -> None:
    raw = _shapes(digits)[shape]
    assert normalized(raw) == reference(raw)


@settings(max_examples=3000, deadline=None)
@given(raw=st.text(alphabet="0123456789+() -.8x\u0661\u0662\uff19\uff11", max_size=24))
@example(raw="+79123456789")
@example(raw="9\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669")  # Arabic-Indic digits
@example(raw="8 912 345 67 89")
@example(raw="+7 (912) 345-67-89")
def test_any_text_of_phone_characters_normalises_as_phonenumbers_does(raw: str) -> None:
    assert normalized(raw) == reference(raw)


def test_every_national_number_range_agrees() -> None:
    """Each leading three digits in every shape (a thousand ranges, valid and not)."""
    for prefix in range(1000):
        digits = f"{prefix:03d}4567890"
        for raw in _shapes(digits):
            assert normalized(raw) == reference(raw), raw

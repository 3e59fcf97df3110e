"""Phone numbers: E.164 normalisation and masking for logs."""

from __future__ import annotations

import phonenumbers

DEFAULT_REGION = "RU"  # Talent writes Russian numbers without a country code (CONTRACTS section 5).


class InvalidPhoneError(ValueError):
    """The text is not a valid phone number."""


def normalize_phone(raw: str) -> str:
    """`+7 (912) 345-67-89` and `8 912 345 67 89` both become `+79123456789`."""
    try:
        parsed = phonenumbers.parse(raw, DEFAULT_REGION)
    except phonenumbers.NumberParseException:
        raise InvalidPhoneError("not a phone number") from None
    if not phonenumbers.is_valid_number(parsed):
        raise InvalidPhoneError("not a valid phone number")
    return str(phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164))


def mask_phone(phone: str) -> str:
    """What a log may show of a phone: `+7***1234`."""
    digits = phone.lstrip("+")
    if len(digits) < 6:
        return "***"
    return f"+{digits[0]}***{digits[-4:]}"

"""Phone numbers: E.164 normalisation and masking for logs."""

from __future__ import annotations

import re

import phonenumbers

DEFAULT_REGION = "RU"  # Talent writes Russian numbers without a country code (CONTRACTS section 5).

# The shapes Talent writes a Russian number in, national number captured: `+79123456789`, `9123456789`,
# `8 912 345 67 89`, `+7 (912) 345-67-89`. Only national numbers starting 3, 4 or 9: for those, parsing
# with phonenumbers yields country code 7 and exactly the captured digits (no national prefix `8`, no
# international prefix `810` and no country code `7` can be read off their start), so only the validity
# check is left to do. Anything else takes the full parse.
_RUSSIAN_FORMS = re.compile(
    r"(?:\+7)?(?P<plain>[349]\d{9})"
    r"|8 (?P<a>[349]\d\d) (?P<b>\d{3}) (?P<c>\d\d) (?P<d>\d\d)"
    r"|\+7 \((?P<e>[349]\d\d)\) (?P<f>\d{3})-(?P<g>\d\d)-(?P<h>\d\d)",
    re.ASCII,  # other scripts' digits take the full parse, which turns them into ASCII ones
)


class InvalidPhoneError(ValueError):
    """The text is not a valid phone number."""


def normalize_phone(raw: str) -> str:
    """`+7 (912) 345-67-89` and `8 912 345 67 89` both become `+79123456789`."""
    form = _RUSSIAN_FORMS.fullmatch(raw)
    if form is None:
        return _parsed(raw)
    national = "".join(part for part in form.groups() if part)
    if not phonenumbers.is_valid_number(
        phonenumbers.PhoneNumber(country_code=7, national_number=int(national))
    ):
        raise InvalidPhoneError("not a valid phone number")
    return f"+7{national}"


def _parsed(raw: str) -> str:
    """Any written form, through phonenumbers' full parse (a tenth of the work is the validity check)."""
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

"""Validates consumed events against the JSON Schemas in schemas/events/."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas" / "events"


@cache
def _validator(event_type: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMA_DIR / f"{event_type}.schema.json").read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)  # type: ignore[no-any-return]


def validate_event(body: dict[str, Any]) -> None:
    _validator(body["eventType"]).validate(body)

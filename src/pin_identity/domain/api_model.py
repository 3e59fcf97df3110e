"""The shape every operator document shares (CONTRACTS sections 2 and 6): Python names its fields in
snake_case, JSON carries their camelCase aliases. A read model is its own document: the stores build it by
field name, the HTTP API answers it and the CLI prints it with `--json`, so adding a field is adding it here
once (and to the SQL that reads it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        frozen=True,
    )

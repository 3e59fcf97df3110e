"""The shape every operator document shares (CONTRACTS sections 2 and 6): Python names its fields in
snake_case, JSON carries their camelCase aliases. What a store returns for operators is its own document
(defined beside its port): the store builds it by field name, the HTTP API answers it and the CLI prints it
with `--json`, so adding a field is adding it there once (and to the SQL that reads it)."""

from __future__ import annotations

from typing import Any

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

    def __init_subclass__(cls, *, schema_name: str | None = None, **kwargs: Any) -> None:
        """`schema_name`: the document's name in the admin API's OpenAPI document where it is not the class's
        (`class FanOutTaskView(ApiModel, schema_name="FanOutTask")`). A class renamed in Python keeps the
        schema name clients know: pydantic keys the schema by the class's qualified name and titles it by
        the configured title, both read when the class is completed, after this hook."""
        super().__init_subclass__(**kwargs)
        if schema_name is not None:
            cls.__qualname__ = schema_name
            cls.model_config["title"] = schema_name

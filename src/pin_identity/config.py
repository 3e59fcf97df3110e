"""Configuration from the environment (CONTRACTS section 1), validated once at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pin_identity.domain.errors import ServiceError
from pin_identity.domain.fanout import FanOutSettings
from pin_identity.domain.talent import TENANTS_TOPIC, USERS_TOPIC
from pin_identity.domain.talent_import import ImportSettings

ENV_PREFIX = "PIN_IDENTITY_"


class ConfigurationError(ServiceError):
    """A setting is missing or invalid; the message is one line naming the variable."""

    code = "IDENTITY_MISCONFIGURED"


PositiveInt = Annotated[int, Field(ge=1)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=".env", extra="ignore", frozen=True)

    database_url: str | None = None
    data_dir: Path = Path("./.pin-identity")
    kafka_bootstrap_servers: str | None = None
    # Kept as the raw JSON text so that a parse error names the variable like every other error.
    kafka_config: str = ""
    talent_api_url: str | None = None
    talent_api_token: str | None = None
    admin_token: str | None = None
    admin_tokens_file: Path | None = None

    # The defaults are the jobs' own (FanOutSettings, ImportSettings: one home each); these override them.
    fanout_polling_interval_s: Annotated[float, Field(gt=0)] = FanOutSettings.polling_interval_s
    fanout_batch_size: Annotated[int, Field(ge=1, le=10_000)] = FanOutSettings.batch_size
    fanout_max_lease_s: PositiveInt = FanOutSettings.max_lease_s
    fanout_max_attempts: PositiveInt = FanOutSettings.max_attempts
    inline_fanout_threshold: Annotated[int, Field(ge=0)] = 200

    # Talent's names are fixed by CONTRACTS section 5; overridable for staging clusters and tests.
    talent_tenants_topic: str = TENANTS_TOPIC
    talent_users_topic: str = USERS_TOPIC
    talent_sync_group: str = "pin-identity-talent-sync"

    import_page_lease_s: PositiveInt = ImportSettings.page_lease_s
    import_max_page_attempts: PositiveInt = ImportSettings.max_page_attempts
    talent_import_mode: Literal["api-pull", "topic-replay"] = "api-pull"

    log_format: Literal["console", "json"] | None = None
    # With log_format "console": an unexpected error prints its traceback after its one line.
    debug: bool = False
    worker_http_port: Annotated[int, Field(ge=0, le=65535)] = 9464

    kafka_topic_partitions: PositiveInt = 12
    kafka_replication_factor: PositiveInt | None = None
    # Off where a separate admin job creates the topics (the relay's principal may not): the relay then
    # holds the events of a missing topic until someone creates it.
    outbox_relay_creates_topics: bool = True

    # Runtime hygiene beyond the contract's list: every connection carries these limits.
    db_pool_max_size: Annotated[int, Field(ge=2, le=100)] = 10
    db_statement_timeout_ms: PositiveInt = 30_000
    db_idle_in_transaction_timeout_ms: PositiveInt = 60_000
    # How long the relay's session may go silent (SilenceLimit): within it, plus the standby's 2 s look, a
    # standby takes over from a relay whose host or path vanished, and that relay's /healthz fails. Above
    # the longest a healthy relay leaves its session quiet (a 10 s back-off, a 10 s stop), under 30 s with
    # the look and a producer start.
    relay_session_timeout_s: Annotated[float, Field(ge=1, le=3600)] = 15.0

    @field_validator("kafka_config")
    @classmethod
    def _check_kafka_config(cls, raw: str) -> str:
        _parse_kafka_properties(raw)
        return raw

    @field_validator("admin_tokens_file", mode="before")
    @classmethod
    def _blank_is_unset(cls, raw: object) -> object:
        # `PIN_IDENTITY_ADMIN_TOKENS_FILE=` would otherwise name the working directory.
        return None if isinstance(raw, str) and not raw.strip() else raw

    @property
    def kafka_properties(self) -> dict[str, str]:
        """Extra librdkafka properties (security.protocol, sasl.*, ...)."""
        return _parse_kafka_properties(self.kafka_config)


def _parse_kafka_properties(raw: str) -> dict[str, str]:
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(parsed, dict):
        raise ValueError("must be a JSON object of librdkafka properties")
    return {str(key): str(value) for key, value in parsed.items()}


def load_settings(**overrides: Any) -> Settings:
    """Read the environment; a bad value becomes one ConfigurationError line naming its variable."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        raise ConfigurationError(f"{ENV_PREFIX}{field.upper()}: {first['msg']}") from None
    except ValueError as exc:
        raise ConfigurationError(f"invalid configuration: {exc}") from None

"""Configuration from the environment (CONTRACTS section 1), validated once at start."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
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

    # Neither this nor the JSON below is shown in a repr: either may carry a secret written inline.
    database_url: str | None = Field(default=None, repr=False)
    # Read from its file (a mounted secret), never from a variable or the command line; libpq gets it
    # beside the URL, so the URL shown anywhere carries none.
    database_password: str | None = Field(default=None, exclude=True, repr=False)
    data_dir: Path = Path("./.pin-identity")
    kafka_bootstrap_servers: str | None = None
    # Kept as the raw JSON text so that a parse error names the variable like every other error.
    kafka_config: str = Field(default="", repr=False)
    # librdkafka properties as `name=value` lines; a value `${file:/path}` is that file's content.
    kafka_config_file: Path | None = None
    talent_api_url: str | None = None
    talent_api_token: str | None = Field(default=None, repr=False)
    admin_token: str | None = Field(default=None, repr=False)
    admin_tokens_file: Path | None = None
    # Where a secret above is read from instead (SECRET_FILES): `PIN_IDENTITY_<SECRET>_FILE`.
    database_password_file: Path | None = None
    talent_api_token_file: Path | None = None
    admin_token_file: Path | None = None

    # The defaults are the jobs' own (FanOutSettings, ImportSettings: one home each); these override them.
    fanout_polling_interval_s: Annotated[float, Field(gt=0)] = FanOutSettings.polling_interval_s
    fanout_batch_size: Annotated[int, Field(ge=1, le=10_000)] = FanOutSettings.batch_size
    fanout_max_lease_s: PositiveInt = FanOutSettings.max_lease_s
    fanout_max_attempts: PositiveInt = FanOutSettings.max_attempts
    fanout_outbox_backlog_limit: Annotated[int, Field(ge=0)] = FanOutSettings.outbox_backlog_limit
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

    @model_validator(mode="before")
    @classmethod
    def _read_secret_files(cls, values: Any) -> Any:
        """Each `<SECRET>_FILE` variable: the secret is its file's content (a mounted secret)."""
        if not isinstance(values, dict):
            return values
        for secret in SECRET_FILES:
            path = values.get(f"{secret}_file")
            if path is None or not str(path).strip():
                continue
            if values.get(secret):
                raise ValueError(
                    f"{_variable(secret)} and {_variable(secret)}_FILE are both set; keep the file alone"
                )
            values = {**values, secret: read_secret_file(Path(path), f"{_variable(secret)}_FILE")}
        return values

    @field_validator("kafka_config")
    @classmethod
    def _check_kafka_config(cls, raw: str) -> str:
        _parse_kafka_properties(raw)
        return raw

    @field_validator("kafka_config_file")
    @classmethod
    def _check_kafka_config_file(cls, path: Path | None) -> Path | None:
        if path is not None:
            _read_properties_file(path)
        return path

    @field_validator("admin_tokens_file", "kafka_config_file", mode="before")
    @classmethod
    def _blank_is_unset(cls, raw: object) -> object:
        # `PIN_IDENTITY_ADMIN_TOKENS_FILE=` would otherwise name the working directory.
        return None if isinstance(raw, str) and not raw.strip() else raw

    @property
    def kafka_properties(self) -> dict[str, str]:
        """librdkafka properties (security.protocol, sasl.*, ...): the file's, then the variable's over them,
        each `${file:...}` value read from its file when asked (a process asks once, at its start: a rotated
        password is taken by the pod's restart)."""
        from_file = _read_properties_file(self.kafka_config_file) if self.kafka_config_file else {}
        return {**from_file, **_parse_kafka_properties(self.kafka_config)}


# The settings a `<VARIABLE>_FILE` may hold instead (CONTRACTS section 1).
SECRET_FILES = ("database_password", "talent_api_token", "admin_token")
_FILE_REFERENCE = re.compile(r"\$\{file:(?P<path>[^}]+)\}")


def _variable(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def read_secret_file(path: Path, named_by: str) -> str:
    """A secret's file, without the line end a mounted secret often has. The error names the file, never
    its content."""
    try:
        secret = path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ValueError(f"{named_by}: cannot read {path} ({reason})") from None
    if not secret:
        raise ValueError(f"{named_by}: {path} is empty")
    return secret


def _resolve_files(properties: dict[str, str], named_by: str) -> dict[str, str]:
    resolved = {}
    for name, value in properties.items():
        reference = _FILE_REFERENCE.fullmatch(value.strip())
        resolved[name] = (
            read_secret_file(Path(reference["path"]), f"{named_by} ({name})") if reference else value
        )
    return resolved


def _read_properties_file(path: Path) -> dict[str, str]:
    """`name=value` lines (a Kafka client's .properties form: `#` and `!` start a comment)."""
    named_by = "PIN_IDENTITY_KAFKA_CONFIG_FILE"
    properties: dict[str, str] = {}
    for number, line in enumerate(read_secret_file(path, named_by).splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        name, separator, value = stripped.partition("=")
        if not separator or not name.strip():
            raise ValueError(f"{named_by}: {path} line {number} is not `name=value`")
        properties[name.strip()] = value.strip()
    return _resolve_files(properties, named_by)


def _parse_kafka_properties(raw: str) -> dict[str, str]:
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(parsed, dict):
        raise ValueError("must be a JSON object of librdkafka properties")
    properties = {str(key): str(value) for key, value in parsed.items()}
    return _resolve_files(properties, "PIN_IDENTITY_KAFKA_CONFIG")


def load_settings(**overrides: Any) -> Settings:
    """Read the environment; a bad value becomes one ConfigurationError line naming its variable."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        if not first["loc"]:  # a rule across variables: its message names them
            raise ConfigurationError(message) from None
        field = str(first["loc"][0])
        # A message that names its variable already (a file it points to) is not prefixed twice.
        if message.startswith(ENV_PREFIX):
            raise ConfigurationError(message) from None
        raise ConfigurationError(f"{_variable(field)}: {message}") from None
    except ValueError as exc:
        raise ConfigurationError(f"invalid configuration: {exc}") from None

"""Configuration from the environment (CONTRACTS section 1), validated once at start: one tree, `Settings`,
whose sections (`FanOutSettings`, `RelaySettings`, `TalentSyncSettings`, `ImportSettings`) are the jobs' own
tunables. Every leaf is a variable: `PIN_IDENTITY_<FIELD>` at the root, `PIN_IDENTITY_<SECTION>_<FIELD>` in a
section (`PIN_IDENTITY_FANOUT_BATCH_SIZE`); `variables()` lists them all."""

from __future__ import annotations

import ipaddress
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pin_identity.domain.backoff import Backoff
from pin_identity.domain.errors import ServiceError
from pin_identity.domain.lease import LeaseRules
from pin_identity.domain.talent import TENANTS_TOPIC, USERS_TOPIC

ENV_PREFIX = "PIN_IDENTITY_"


class ConfigurationError(ServiceError):
    """A setting is missing or invalid; the message is one line naming the variable."""

    code = "IDENTITY_MISCONFIGURED"


PositiveInt = Annotated[int, Field(ge=1)]
# A wait of 0 looks again at once (the tests' pace); no tunable takes a negative one.
Seconds = Annotated[float, Field(ge=0)]


class Section(BaseModel):
    """A job's tunables: read once with the rest of the tree, then handed to the job that owns them."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class FanOutSettings(Section):
    """PollingInterval, BatchSize, MaxLeaseDuration, MaxAttempts (CONTRACTS section 1) and the pace."""

    # Above 0: an idle worker would otherwise ask the database for a task in a tight loop.
    polling_interval_s: Annotated[float, Field(gt=0)] = 5.0
    batch_size: Annotated[int, Field(ge=1, le=10_000)] = 500
    max_lease_s: PositiveInt = 300
    max_attempts: PositiveInt = 5
    # Events waiting in the outbox (the relay's in flight among them) above which the next page waits for
    # the relay, at most outbox_wait_max_s a page (0: never). A point change commits behind every event
    # already waiting, so a fan-out that outruns the relay delays it (BENCHMARKS.md, "A point change
    # during a fan-out"); it costs a million-user fan-out about an eighth of its time.
    outbox_backlog_limit: Annotated[int, Field(ge=0)] = 10_000
    outbox_wait_max_s: Seconds = 5.0

    @property
    def lease_rules(self) -> LeaseRules:
        """MaxLeaseDuration and MaxAttempts; after a failed attempt the task waits a little (2 s, doubling),
        never longer than a lease."""
        backoff = Backoff(base_s=2.0, cap_s=self.max_lease_s)
        return LeaseRules(timedelta(seconds=self.max_lease_s), self.max_attempts, backoff)


# The longest the relay's producer waits on the transaction coordinator in one call (a commit, an abort, the
# initialisation: adapters/kafka/publisher.py): its session with the database stays silent meanwhile.
RELAY_COORDINATOR_CALL_S = 5.0
# A wait above 0: a loop that looks again at once is a busy loop, a core spent on nothing.
Pause = Annotated[float, Field(gt=0)]


class RelaySettings(Section):
    batch_size: PositiveInt = 2000
    # Events handed to the producer before the first is acknowledged: fetching the next batch
    # overlaps the broker's work on the previous one.
    max_in_flight: PositiveInt = 20_000
    # The relay's memory for events, whatever their size: half for the rows it read and holds, a quarter for
    # the producer's queue, a quarter for one read. Fits the deployment's 256 MiB pod with the process's own
    # (deploy/README.md, "Sizes"); a user's snapshot of thousands of assignments is 1-4 MB.
    memory_mb: Annotated[int, Field(ge=16, le=65_536)] = 64
    idle_wait_s: Pause = 0.05
    standby_wait_s: Pause = 2.0
    max_backoff_s: Seconds = 10.0
    stop_grace_s: Seconds = 10.0
    backlog_every_s: Seconds = 5.0
    # How often an active relay proves its session (and so its lock) is still there, even while it only
    # waits for the broker: a relay whose session died stops its producer within this time.
    heartbeat_every_s: Seconds = 0.5
    # How long the relay's session may go silent (SilenceLimit): within it, plus the standby's 2 s look, a
    # standby takes over from a relay whose host or path vanished, and that relay's /healthz fails. Above
    # the longest a healthy relay leaves its session quiet (a 10 s back-off, a 10 s stop), under 30 s with
    # the look and a producer start.
    session_timeout_s: Annotated[float, Field(ge=1, le=3600)] = 15.0

    @property
    def held_bytes(self) -> int:
        """Values of the rows read and not settled (held behind their keys, ready, in flight)."""
        return self.memory_mb * 2**20 // 2

    @property
    def read_bytes(self) -> int:
        """Values of one read of the outbox."""
        return self.memory_mb * 2**20 // 4

    @property
    def flight_bytes(self) -> int:
        """Values handed to the producer and not settled: its queue holds them (copies) until answered."""
        return self.memory_mb * 2**20 // 4

    @property
    def backoff(self) -> Backoff:
        """0.2 s after the first failure in a row, doubling up to max_backoff_s."""
        return Backoff(base_s=0.2, cap_s=self.max_backoff_s)

    def conflicts(self) -> str | None:
        """Why these settings cannot work together, naming the variables; None when they can. The relay's
        session must outlive its longest silence: a back-off, a stop's grace, the gap between heartbeats, a
        call to the coordinator; past its timeout the server ends it, and the lock goes with it."""
        silences = {
            "PIN_IDENTITY_RELAY_MAX_BACKOFF_S": self.max_backoff_s,
            "PIN_IDENTITY_RELAY_STOP_GRACE_S": self.stop_grace_s,
            "PIN_IDENTITY_RELAY_HEARTBEAT_EVERY_S": self.heartbeat_every_s,
            "the producer's call to the transaction coordinator": RELAY_COORDINATOR_CALL_S,
        }
        limit = self.session_timeout_s
        too_long = [f"{name} ({value:g} s)" for name, value in silences.items() if value >= limit]
        if not too_long:
            return None
        return (
            f"PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S ({limit:g} s) must be longer than {', '.join(too_long)}: "
            "the relay's database session (and its lock) would be ended while it waits"
        )


class TalentSyncSettings(Section):
    # A batch holds a lock per Talent entity it applies (PostgreSQL's shared lock table: 64 per connection by
    # default); at most as many as the largest import page (2,000), which holds as many.
    batch_size: Annotated[int, Field(ge=1, le=2000)] = 500
    poll_timeout_s: Pause = 1.0
    retry_base_s: Seconds = 1.0
    retry_max_s: Seconds = 300.0
    max_deferrals: PositiveInt = (
        12  # then the item stays quarantined for the operator (about 20 min of retries)
    )
    error_backoff_max_s: Seconds = 30.0

    @property
    def retry_backoff(self) -> Backoff:
        """When a deferred item (a user before its tenant) is tried again."""
        return Backoff(base_s=self.retry_base_s, cap_s=self.retry_max_s)

    @property
    def error_backoff(self) -> Backoff:
        """The pause after a batch that failed to apply (the database is away)."""
        return Backoff(base_s=0.5, cap_s=self.error_backoff_max_s)


class ImportSettings(Section):
    """How a process takes part in runs: its page leases and attempts, its pace, how far it plans ahead."""

    page_lease_s: PositiveInt = 600
    max_page_attempts: PositiveInt = 5
    idle_wait_s: Seconds = 0.2
    backoff_base_s: Seconds = 1.0
    backoff_max_s: Seconds = 60.0
    max_planning_failures: PositiveInt = 8
    plan_ahead_pages: PositiveInt = 8
    lock_retry_s: Seconds = 5.0

    @property
    def backoff(self) -> Backoff:
        """The wait after a failed page attempt or planning step."""
        return Backoff(base_s=self.backoff_base_s, cap_s=self.backoff_max_s)

    @property
    def lease_rules(self) -> LeaseRules:
        """A page's lease, its attempts, and its back-off after a failed attempt."""
        return LeaseRules(timedelta(seconds=self.page_lease_s), self.max_page_attempts, self.backoff)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        extra="ignore",
        frozen=True,
        validate_by_name=True,
        # A section's variable is its name, then the field's, whose own underscores stay: one split only.
        env_nested_delimiter="_",
        env_nested_max_split=1,
    )

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
    # Plain http:// to a host other than this one sends the token in clear: refused unless said on purpose.
    talent_api_allow_plaintext: bool = False
    admin_token: str | None = Field(default=None, repr=False)
    admin_tokens_file: Path | None = None
    # Where a secret above is read from instead (SECRET_FILES): `PIN_IDENTITY_<SECRET>_FILE`.
    database_password_file: Path | None = None
    talent_api_token_file: Path | None = None
    admin_token_file: Path | None = None

    inline_fanout_threshold: Annotated[int, Field(ge=0)] = 200

    # Talent's names are fixed by CONTRACTS section 5; overridable for staging clusters and tests.
    talent_tenants_topic: str = TENANTS_TOPIC
    talent_users_topic: str = USERS_TOPIC
    talent_sync_group: str = "pin-identity-talent-sync"

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

    # The jobs' sections: `PIN_IDENTITY_FANOUT_BATCH_SIZE` is fanout.batch_size, and so on.
    fanout: FanOutSettings = FanOutSettings()
    relay: RelaySettings = RelaySettings()
    talent_sync: TalentSyncSettings = TalentSyncSettings()
    # `import` is a keyword: the section's name in Python is `imports`, its variables PIN_IDENTITY_IMPORT_*.
    imports: ImportSettings = Field(default=ImportSettings(), validation_alias="pin_identity_import")

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

    @model_validator(mode="after")
    def _check_settings_work_together(self) -> Settings:
        conflict = self.relay.conflicts() or self._token_in_clear()
        if conflict:
            raise ValueError(conflict)
        return self

    def _token_in_clear(self) -> str | None:
        url = urlsplit(self.talent_api_url or "")
        if url.scheme != "http" or not self.talent_api_token or self.talent_api_allow_plaintext:
            return None
        if _loopback(url.hostname or ""):
            return None
        return (
            "PIN_IDENTITY_TALENT_API_URL is plain http:// to another host while "
            "PIN_IDENTITY_TALENT_API_TOKEN is set: the token would cross the network in clear; use "
            "https://, or set PIN_IDENTITY_TALENT_API_ALLOW_PLAINTEXT=true if that network is yours to trust"
        )

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


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# The settings a `<VARIABLE>_FILE` may hold instead (CONTRACTS section 1).
SECRET_FILES = ("database_password", "talent_api_token", "admin_token")
_FILE_REFERENCE = re.compile(r"\$\{file:(?P<path>[^}]+)\}")


def _variable(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _section_prefix(name: str) -> str:
    alias = Settings.model_fields[name].validation_alias
    return f"{alias}_".upper() if isinstance(alias, str) else _variable(name) + "_"


def variables() -> dict[str, str]:
    """Every variable of the tree, each with its place in it (`fanout.batch_size`): the configuration
    table in docs/operators.md lists exactly these."""
    found: dict[str, str] = {}
    for name, field in Settings.model_fields.items():
        if field.exclude:  # read from its `_FILE` alone
            continue
        section = field.annotation
        if isinstance(section, type) and issubclass(section, Section):
            found |= {_section_prefix(name) + leaf.upper(): f"{name}.{leaf}" for leaf in section.model_fields}
        else:
            found[_variable(name)] = name
    return found


def _variable_at(location: tuple[int | str, ...]) -> str:
    """The variable of a validation error's location: a root field, or a section's field."""
    name = str(location[0])
    if name.upper().startswith(ENV_PREFIX):  # an alias names its section's variables whole
        name = next(field for field, info in Settings.model_fields.items() if info.validation_alias == name)
    if name in Settings.model_fields and len(location) > 1:
        return _section_prefix(name) + str(location[1]).upper()
    return _variable(name)


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
        # A message that names its variable already (a file it points to) is not prefixed twice.
        if message.startswith(ENV_PREFIX):
            raise ConfigurationError(message) from None
        raise ConfigurationError(f"{_variable_at(first['loc'])}: {message}") from None
    except ValueError as exc:
        raise ConfigurationError(f"invalid configuration: {exc}") from None

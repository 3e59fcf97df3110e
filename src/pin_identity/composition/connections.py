"""The two servers a process talks to, from the settings: the database's pool and the broker's client
configuration, each made on first use (a command starts only what it touches), with the checks that turn
their failures into one line naming the variable."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property

from psycopg.conninfo import make_conninfo

from pin_identity.adapters.kafka.topics import (
    BrokerProbeError,
    KafkaPropertiesError,
    TopicLayout,
    broker_reachable,
    check_client_properties,
    ensure_topics,
    probe_broker,
    raise_message_limits,
)
from pin_identity.adapters.postgres import grants, migrate
from pin_identity.adapters.postgres.database import ConnectionLimits, Database
from pin_identity.composition import embedded_servers
from pin_identity.composition.failures import (
    DATABASE_REFUSED,
    DATABASE_UNREACHABLE,
    broker_failure_line,
)
from pin_identity.config import ConfigurationError, Settings
from pin_identity.domain.events import PUBLISHED_TOPICS
from pin_identity.observability.logging import first_line

# A command that needs the broker waits this long for it at start (a healthy one answers in milliseconds).
BROKER_START_TIMEOUT_S = 5.0


@dataclass
class Connections:
    settings: Settings
    # What `close()` undoes, last made first: the pool, and whatever the builders above opened on it.
    closers: list[Callable[[], None]] = field(default_factory=list)

    @cached_property
    def database_url(self) -> str:
        return embedded_servers.database_url(self.settings)

    @property
    def database_conninfo(self) -> str:
        """The URL with the password from PIN_IDENTITY_DATABASE_PASSWORD_FILE, for libpq alone: what is
        shown or logged is `database_url`, which holds none."""
        password = self.settings.database_password
        return make_conninfo(self.database_url, password=password) if password else self.database_url

    @cached_property
    def database(self) -> Database:
        settings = self.settings
        limits = ConnectionLimits(
            settings.db_statement_timeout_ms, settings.db_idle_in_transaction_timeout_ms
        )
        database = Database(self.database_conninfo, limits=limits, max_size=settings.db_pool_max_size)
        try:
            database.open()
        except Exception as exc:
            raise ConfigurationError(DATABASE_UNREACHABLE.format(first_line(exc))) from None
        self.closers.append(database.close)
        return database

    @property
    def kafka_is_embedded(self) -> bool:
        return not self.settings.kafka_bootstrap_servers

    @cached_property
    def kafka_bootstrap_servers(self) -> str:
        return embedded_servers.bootstrap_servers(self.settings)

    @cached_property
    def kafka_client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.kafka_bootstrap_servers, **self.settings.kafka_properties}

    @property
    def topic_layout(self) -> TopicLayout:
        replication = self.settings.kafka_replication_factor or (1 if self.kafka_is_embedded else 3)
        return TopicLayout(self.settings.kafka_topic_partitions, replication)

    def upgrade_schema(self) -> None:
        # Through the pool first: an unreachable database is then the same one line as for every other
        # command, not a traceback from inside Alembic.
        self.require_database()
        migrate.upgrade(self.database_conninfo)

    def require_database(self) -> None:
        """Raise ConfigurationError naming PIN_IDENTITY_DATABASE_URL unless the database answers."""
        if not self.database.ping():
            raise ConfigurationError(DATABASE_UNREACHABLE.format("it does not answer"))

    def check_database_grants(self, jobs: Iterable[str]) -> None:
        """Raise ConfigurationError naming the first privilege of `jobs`' rows (grants.py) that the database
        role lacks: a job started without one would fail at its first statement that needs it, maybe hours
        later."""
        wanted = [row for row in grants.job_grants() if row.job in set(jobs)]
        with self.database.connection() as conn:
            missing = grants.missing_grants(conn, wanted)
        if missing:
            others = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise ConfigurationError(DATABASE_REFUSED.format(f"{missing[0]}{others}"))

    def check_kafka_config(self) -> None:
        """Raise ConfigurationError naming PIN_IDENTITY_KAFKA_CONFIG if librdkafka refuses its properties."""
        try:
            check_client_properties(self.settings.kafka_properties)
        except KafkaPropertiesError as exc:
            raise ConfigurationError(f"PIN_IDENTITY_KAFKA_CONFIG: {exc}") from None

    def require_broker(self) -> None:
        """Raise ConfigurationError, within seconds, naming the variable to check unless a broker answers."""
        try:
            probe_broker(self.kafka_client_config, timeout_s=BROKER_START_TIMEOUT_S)
        except BrokerProbeError as exc:  # or refused: `failure` says which
            raise ConfigurationError(broker_failure_line(self.settings, exc.failure, exc)) from None

    def broker_reachable(self) -> bool:
        return broker_reachable(self.kafka_client_config)

    def ensure_topics(self) -> list[str]:
        return ensure_topics(self.kafka_client_config, PUBLISHED_TOPICS, self.topic_layout)

    def raise_message_limits(self) -> list[str]:
        return raise_message_limits(self.kafka_client_config, PUBLISHED_TOPICS)

    def close(self) -> None:
        for close in reversed(self.closers):
            close()
        self.closers.clear()

"""The composition root: the one place that turns settings into connected adapters and jobs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pin_identity.adapters.embedded_state import (
    EmbeddedServer,
    embedded_broker_state,
    embedded_postgres_state,
)
from pin_identity.adapters.kafka import acls
from pin_identity.adapters.kafka import embedded as embedded_kafka
from pin_identity.adapters.kafka.access_log import KafkaAccessLog
from pin_identity.adapters.kafka.access_lookup import KafkaUserAccessLog
from pin_identity.adapters.kafka.denials import is_denial
from pin_identity.adapters.kafka.distribution import KafkaRuntime, KafkaRuntimeUnavailableError, kafka_runtime
from pin_identity.adapters.kafka.group_lag import KafkaConsumerLag
from pin_identity.adapters.kafka.partitioning import UnsupportedPartitionerError
from pin_identity.adapters.kafka.publisher import KafkaEventPublisher
from pin_identity.adapters.kafka.reader import TopicReader
from pin_identity.adapters.kafka.replay_source import TopicReplaySource
from pin_identity.adapters.kafka.talent_stream import KafkaTalentStream
from pin_identity.adapters.kafka.topics import (
    BrokerFailure,
    BrokerUnavailableError,
    KafkaPropertiesError,
    TopicLayout,
    broker_failure,
    broker_reachable,
    check_client_properties,
    ensure_topics,
    probe_broker,
    replication_shortfall,
)
from pin_identity.adapters.postgres import embedded as embedded_postgres
from pin_identity.adapters.postgres import grants, migrate
from pin_identity.adapters.postgres.access_truth import PostgresAccessTruth
from pin_identity.adapters.postgres.admin_reads import PostgresAdminReads
from pin_identity.adapters.postgres.database import ConnectionLimits, Database, SilenceLimit
from pin_identity.adapters.postgres.demo_data import PostgresDemoReads
from pin_identity.adapters.postgres.fanout_queue import PostgresFanOutQueue, PostgresTaskWakeups
from pin_identity.adapters.postgres.identity_store import PostgresIdentityTransactions
from pin_identity.adapters.postgres.import_store import PostgresImportStore, PostgresRunLock
from pin_identity.adapters.postgres.outbox_queue import PostgresOutboxQueue
from pin_identity.adapters.postgres.replica_store import PostgresReplicaTransactions
from pin_identity.adapters.postgres.retention import PostgresRetention
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.adapters.talent_http.client import TalentApiClient
from pin_identity.adapters.talent_http.source import ApiPullSource
from pin_identity.config import ConfigurationError, Settings
from pin_identity.domain.access_audit import AuditReport
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import (
    AccessLogUnavailableError,
    ConsumerLagUnavailableError,
    SourceNotConfiguredError,
    SourceUnavailableError,
)
from pin_identity.domain.events import PUBLISHED_TOPICS
from pin_identity.domain.fanout import FanOutPolicy, FanOutSettings
from pin_identity.domain.talent_import import ImportMode, ImportSettings
from pin_identity.jobs.access_fanout import AccessFanOutJob
from pin_identity.jobs.outbox_relay import OutboxRelay, RelaySettings
from pin_identity.jobs.outbox_relay_observer import RelayObserver
from pin_identity.jobs.talent_import import TalentImportJob
from pin_identity.jobs.talent_sync import TalentSyncJob, TalentSyncSettings
from pin_identity.jobs.talent_sync_observer import TalentSyncObserver
from pin_identity.observability.logging import first_line
from pin_identity.operations.access_audit import audit_access
from pin_identity.operations.access_show import show_access
from pin_identity.operations.fanout_admin import FanOutAdmin
from pin_identity.operations.health import HealthReads
from pin_identity.operations.imports import ImportOperations
from pin_identity.operations.ports.audit import Progress
from pin_identity.operations.ports.imports import RunLock
from pin_identity.operations.ports.outbox import OutboxBacklogSession
from pin_identity.operations.ports.talent import TalentSource
from pin_identity.operations.read_models import UserAccess
from pin_identity.operations.retention import RetentionAdmin
from pin_identity.operations.roles import RoleAdmin

# The jobs the Kafka ACL table grants rights to, each its own principal (`kafka acls`).
KAFKA_JOBS = acls.JOBS
# The jobs the database grants give a role of its own (`db grants`), the schema's owner first.
DATABASE_JOBS = (grants.OWNER, *grants.JOBS)
# A command that needs the broker waits this long for it at start (a healthy one answers in milliseconds).
BROKER_START_TIMEOUT_S = 5.0


class BrokerUnreachableError(ConfigurationError):
    """A read that needs the broker now (`access show`) got no answer: the CLI says it as any configuration
    failure (exit 2, naming the variable), the HTTP API as 503."""

    code = "IDENTITY_BROKER_UNAVAILABLE"


def _missing_extra(what: str) -> ConfigurationError:
    return ConfigurationError(
        f"{what} is not configured and the embedded server is not installed "
        "(pip install 'pin-identity[embedded]')"
    )


@dataclass
class Container:
    """Everything a command needs, built on first use so that a command only starts what it touches."""

    settings: Settings
    clock: Clock = SYSTEM_CLOCK
    _closers: list[Any] = field(default_factory=list)
    _relay_queues: list[PostgresOutboxQueue] = field(default_factory=list)

    @cached_property
    def database_url(self) -> str:
        if self.settings.database_url:
            return self.settings.database_url
        try:
            return embedded_postgres.ensure_embedded_postgres(self.settings.data_dir)
        except ImportError:
            raise _missing_extra("PIN_IDENTITY_DATABASE_URL") from None

    @property
    def _database_conninfo(self) -> str:
        """The URL with the password from PIN_IDENTITY_DATABASE_PASSWORD_FILE, for libpq alone: what is
        shown or logged is `database_url`, which holds none."""
        password = self.settings.database_password
        return make_conninfo(self.database_url, password=password) if password else self.database_url

    @property
    def kafka_is_embedded(self) -> bool:
        return not self.settings.kafka_bootstrap_servers

    @cached_property
    def kafka_bootstrap_servers(self) -> str:
        if self.settings.kafka_bootstrap_servers:
            return self.settings.kafka_bootstrap_servers
        try:
            return embedded_kafka.ensure_embedded_kafka(self.settings.data_dir)
        except KafkaRuntimeUnavailableError as exc:
            raise _no_embedded_kafka(exc) from None

    @cached_property
    def kafka_client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.kafka_bootstrap_servers, **self.settings.kafka_properties}

    @property
    def topic_layout(self) -> TopicLayout:
        replication = self.settings.kafka_replication_factor or (1 if self.kafka_is_embedded else 3)
        return TopicLayout(self.settings.kafka_topic_partitions, replication)

    @cached_property
    def database(self) -> Database:
        limits = ConnectionLimits(
            self.settings.db_statement_timeout_ms, self.settings.db_idle_in_transaction_timeout_ms
        )
        database = Database(self._database_conninfo, limits=limits, max_size=self.settings.db_pool_max_size)
        try:
            database.open()
        except Exception as exc:
            raise ConfigurationError(_DATABASE_UNREACHABLE.format(first_line(exc))) from None
        self._closers.append(database.close)
        return database

    @cached_property
    def transactions(self) -> PostgresIdentityTransactions:
        return PostgresIdentityTransactions(self.database)

    @cached_property
    def replica_transactions(self) -> PostgresReplicaTransactions:
        return PostgresReplicaTransactions(self.database)

    @property
    def fanout_policy(self) -> FanOutPolicy:
        return FanOutPolicy(self.settings.inline_fanout_threshold)

    def upgrade_schema(self) -> None:
        # Through the pool first: an unreachable database is then the same one line as for every other
        # command, not a traceback from inside Alembic.
        self.require_database()
        migrate.upgrade(self._database_conninfo)

    def require_database(self) -> None:
        """Raise ConfigurationError naming PIN_IDENTITY_DATABASE_URL unless the database answers."""
        if not self.database.ping():
            raise ConfigurationError(_DATABASE_UNREACHABLE.format("it does not answer"))

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
        except BrokerUnavailableError as exc:  # or refused: `failure` says which
            raise ConfigurationError(self._broker_failure(exc.failure, exc)) from None

    def ensure_topics(self) -> list[str]:
        return ensure_topics(self.kafka_client_config, PUBLISHED_TOPICS, self.topic_layout)

    def kafka_acl_script(self, principals: Mapping[str, str]) -> list[str]:
        """The `kafka-acls.sh` commands that grant each job exactly what it uses (deploy/README.md), for
        this configuration's Talent names; `principals` overrides the default principal of a job."""
        settings = self.settings
        talent = acls.TalentNames(
            settings.talent_tenants_topic, settings.talent_users_topic, settings.talent_sync_group
        )
        return acls.acl_script(acls.job_grants(talent), {**acls.default_principals(), **principals})

    def database_grant_script(self, roles: Mapping[str, str], *, administrator: bool) -> list[str]:
        """The SQL that gives each job's role exactly what it uses (deploy/README.md): the schema owner's
        part, or the administrator's (`roles` overrides the default role of a job)."""
        return [statement.as_string(None) for statement in self._grant_statements(roles, administrator)]

    def apply_database_grants(self, roles: Mapping[str, str], *, administrator: bool) -> grants.Applied:
        try:
            return grants.apply(self._database_conninfo, self._grant_statements(roles, administrator))
        except psycopg.errors.UndefinedObject as exc:  # a role not made yet
            advice = "apply the administrator's part first (`db grants --administrator`)"
            raise ConfigurationError(_DATABASE_APPLY.format(first_line(exc), advice)) from None
        except psycopg.errors.InsufficientPrivilege as exc:
            advice = "apply it as an administrator" if administrator else "apply it as the schema's owner"
            raise ConfigurationError(_DATABASE_APPLY.format(first_line(exc), advice)) from None

    def _grant_statements(self, roles: Mapping[str, str], administrator: bool) -> list[sql.Composed]:
        chosen = {**grants.default_roles(), **roles}
        if not administrator:
            return grants.owner_script(grants.job_grants(), chosen)
        # Printing needs no server: the configured URL's name, else the embedded server's.
        url = self.settings.database_url
        database = str(conninfo_to_dict(url).get("dbname", "")) if url else embedded_postgres.DATABASE_NAME
        timeout_ms = self.settings.db_idle_in_transaction_timeout_ms
        return grants.administrator_script(chosen, database, timeout_ms)

    def check_database_grants(self, jobs: Iterable[str]) -> None:
        """Raise ConfigurationError naming the first privilege of `jobs`' rows (grants.py) that the database
        role lacks: a job started without one would fail at its first statement that needs it, maybe hours
        later."""
        wanted = [row for row in grants.job_grants() if row.job in set(jobs)]
        with self.database.connection() as conn:
            missing = grants.missing_grants(conn, wanted)
        if missing:
            others = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise ConfigurationError(_DATABASE_REFUSED.format(f"{missing[0]}{others}"))

    def broker_reachable(self) -> bool:
        return broker_reachable(self.kafka_client_config)

    def outbox_relay(
        self, settings: RelaySettings | None = None, observer: RelayObserver | None = None
    ) -> OutboxRelay:
        queue = PostgresOutboxQueue(self.database, SilenceLimit(self.settings.relay_session_timeout_s))
        self._relay_queues.append(queue)
        # One transactional.id per outbox: the relay that takes over fences every producer before it. An
        # operator may set one in PIN_IDENTITY_KAFKA_CONFIG (a cluster whose ACLs grant a prefix); it must
        # then be this outbox's alone.
        configured = self.settings.kafka_properties.get("transactional.id")
        transactional_id = configured or queue.transactional_id()
        publisher = KafkaEventPublisher(
            self.kafka_client_config,
            ensure_topics=self.ensure_topics if self.settings.outbox_relay_creates_topics else None,
            own_topics=PUBLISHED_TOPICS,
            transactional_id=transactional_id,
            replication_shortfall=lambda: replication_shortfall(self.kafka_client_config, PUBLISHED_TOPICS),
        )
        self._closers.append(publisher.close)
        self._closers.append(queue.reset)
        return OutboxRelay(queue, publisher, settings or RelaySettings(), observer, clock=self.clock)

    def relay_stalled(self) -> bool:
        """Whether a relay of this process has waited on its database session for longer than
        PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S: its path went silent where its TCP sees nothing wrong."""
        return any(queue.stalled() for queue in self._relay_queues)

    @property
    def fanout_settings(self) -> FanOutSettings:
        return FanOutSettings(
            polling_interval_s=self.settings.fanout_polling_interval_s,
            batch_size=self.settings.fanout_batch_size,
            max_lease_s=self.settings.fanout_max_lease_s,
            max_attempts=self.settings.fanout_max_attempts,
            outbox_backlog_limit=self.settings.fanout_outbox_backlog_limit,
        )

    @cached_property
    def fanout_queue(self) -> PostgresFanOutQueue:
        return PostgresFanOutQueue(self.database)

    def access_fanout(self) -> AccessFanOutJob:
        return AccessFanOutJob(
            self.fanout_queue, PostgresTaskWakeups(self.database), self.fanout_settings, clock=self.clock
        )

    def talent_sync(
        self, settings: TalentSyncSettings | None = None, observer: TalentSyncObserver | None = None
    ) -> TalentSyncJob:
        stream = KafkaTalentStream(
            self.kafka_client_config,
            tenants_topic=self.settings.talent_tenants_topic,
            users_topic=self.settings.talent_users_topic,
            overrides={"group.id": self.settings.talent_sync_group},
        )
        return TalentSyncJob(
            stream,
            self.replica_transactions,
            settings or TalentSyncSettings(),
            clock=self.clock,
            observer=observer,
        )

    @cached_property
    def import_store(self) -> PostgresImportStore:
        return PostgresImportStore(self.database)

    def run_lock(self) -> PostgresRunLock:
        return PostgresRunLock(self.database)

    def talent_source(self, mode: ImportMode) -> TalentSource:
        if mode is ImportMode.TOPIC_REPLAY:
            return TopicReplaySource(
                self.kafka_client_config,
                tenants_topic=self.settings.talent_tenants_topic,
                users_topic=self.settings.talent_users_topic,
                group_id=self.settings.talent_sync_group,
            )
        if not self.settings.talent_api_url:
            raise ConfigurationError("PIN_IDENTITY_TALENT_API_URL: required for the api-pull import")
        return ApiPullSource(TalentApiClient(self.settings.talent_api_url, self.settings.talent_api_token))

    @property
    def import_settings(self) -> ImportSettings:
        return ImportSettings(
            page_lease_s=self.settings.import_page_lease_s,
            max_page_attempts=self.settings.import_max_page_attempts,
        )

    def _import_source(self, mode: ImportMode) -> TalentSource:
        try:
            return self.talent_source(mode)
        except ConfigurationError as exc:
            raise SourceNotConfiguredError(str(exc)) from None

    def talent_import(self, lock: RunLock | None = None) -> TalentImportJob:
        return TalentImportJob(
            self.import_store, lock or self.run_lock(), self._import_source, self.import_settings, self.clock
        )

    def _operator_source(self, mode: ImportMode) -> TalentSource:
        """A source for starting a run: TopicReplay's is the broker, so an unreachable one is said in seconds
        and one line rather than after librdkafka's retries and log lines."""
        if mode is ImportMode.TOPIC_REPLAY:
            try:
                self.require_broker()
            except ConfigurationError as exc:
                raise SourceUnavailableError(str(exc)) from None
        return self._import_source(mode)

    # ---------------------------------------------------------------- operator actions (CLI and HTTP API)

    @cached_property
    def admin_reads(self) -> PostgresAdminReads:
        return PostgresAdminReads(self.database)

    @cached_property
    def imports(self) -> ImportOperations:
        return ImportOperations(
            self.import_store,
            self.run_lock,
            self._operator_source,
            self.replica_transactions,
            self.clock,
            summaries=self.admin_reads,
        )

    @cached_property
    def fanout_admin(self) -> FanOutAdmin:
        return FanOutAdmin(self.fanout_queue, self.clock)

    @cached_property
    def role_admin(self) -> RoleAdmin:
        return RoleAdmin(self.transactions, self.fanout_policy, self.admin_reads, self.clock)

    @cached_property
    def retention(self) -> RetentionAdmin:
        return RetentionAdmin(PostgresRetention(self.database), self.clock)

    @cached_property
    def health(self) -> HealthReads:
        topics = (self.settings.talent_tenants_topic, self.settings.talent_users_topic)
        lags = KafkaConsumerLag(self._lag_client_config)
        return HealthReads(self.admin_reads, lags, self.settings.talent_sync_group, topics)

    def _lag_client_config(self) -> dict[str, str]:
        """Without a broker to ask, the health summary says the lag is unknown rather than failing whole."""
        try:
            return self.kafka_client_config
        except ConfigurationError as exc:
            raise ConsumerLagUnavailableError(str(exc)) from None

    def outbox_backlog_reader(self) -> OutboxBacklogSession:
        """A session of its own for reading the outbox backlog (`/metrics`); `reset()` closes it."""
        return PostgresOutboxQueue(self.database)

    # ---------------------------------------------------------------- the demo's own reads

    @cached_property
    def demo_reads(self) -> PostgresDemoReads:
        return PostgresDemoReads(self.database)

    def topic_reader(self, topics: Iterable[str]) -> TopicReader:
        """Reads what is published to `topics` from now on (the demo reads its events back)."""
        return TopicReader(self.kafka_client_config, topics)

    def access_audit(self, progress: Progress) -> AuditReport:
        truth = PostgresAccessTruth(self.database)
        self.require_broker()
        return audit_access(KafkaAccessLog(self.kafka_client_config), truth, progress)

    def access_show(self, user_id: UUID) -> UserAccess:
        """NotFoundError for an unknown user; BrokerUnreachableError when the broker does not answer;
        ConfigurationError when PIN_IDENTITY_KAFKA_CONFIG sets a partitioner whose placement cannot be
        computed."""
        try:
            log = KafkaUserAccessLog(self.kafka_client_config)
        except UnsupportedPartitionerError as exc:
            raise ConfigurationError(f"PIN_IDENTITY_KAFKA_CONFIG: {exc}") from None
        try:
            return show_access(log, PostgresAccessTruth(self.database), user_id)
        except AccessLogUnavailableError as exc:
            failure = BrokerFailure.REFUSED if is_denial(str(exc)) else BrokerFailure.UNREACHABLE
            raise BrokerUnreachableError(self._broker_failure(failure, exc)) from None

    def _broker_failure(self, failure: BrokerFailure, reason: object) -> str:
        """The table's line; a refused login names the file it came from when the login is one."""
        line = _BROKER_FAILURES[failure].format(reason)
        if failure is BrokerFailure.REFUSED and self.settings.kafka_config_file:
            return line.replace("PIN_IDENTITY_KAFKA_CONFIG:", "PIN_IDENTITY_KAFKA_CONFIG_FILE:", 1)
        return line

    def close(self) -> None:
        for close in reversed(self._closers):
            close()
        self._closers.clear()


# ---------------------------------------------------------------- the embedded servers (`embedded info/stop`)


def embedded_servers(settings: Settings) -> tuple[EmbeddedServer, EmbeddedServer]:
    """The embedded PostgreSQL and broker under the data dir, as they are: nothing is started."""
    data_dir = settings.data_dir.resolve()
    return (
        embedded_postgres_state(data_dir, in_use=not settings.database_url),
        embedded_broker_state(data_dir, in_use=not settings.kafka_bootstrap_servers),
    )


def fetch_embedded_kafka(settings: Settings) -> KafkaRuntime | None:
    """Fetch the embedded broker's release into the cache and prepare its starts (`embedded fetch`); None
    when a broker of one's own is configured and nothing needs fetching."""
    if settings.kafka_bootstrap_servers:
        return None
    try:
        runtime = kafka_runtime()
    except KafkaRuntimeUnavailableError as exc:
        raise _no_embedded_kafka(exc) from None
    embedded_kafka.prepare_starts(runtime)
    return runtime


def _no_embedded_kafka(exc: KafkaRuntimeUnavailableError) -> ConfigurationError:
    return ConfigurationError(
        f"PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS: unset, and the embedded Apache Kafka cannot run here "
        f"({exc}); set it to a Kafka cluster's bootstrap servers"
    )


def local_port(preferred: int) -> int:
    """`preferred` unless something on this host answers there, else a port free now."""
    return embedded_kafka.free_port() if embedded_kafka.port_open(preferred) else preferred


def stop_embedded_servers(data_dir: Path) -> tuple[bool, bool]:
    """Stop the embedded broker, then PostgreSQL; whether each was running."""
    return embedded_kafka.stop_embedded_kafka(data_dir), embedded_postgres.stop_embedded_postgres(data_dir)


# ---------------------------------------------------------------- failures that name a variable

_DATABASE_UNREACHABLE = "PIN_IDENTITY_DATABASE_URL: database unreachable ({})"
_DATABASE_APPLY = "PIN_IDENTITY_DATABASE_URL: {}; {}"
_DATABASE_REFUSED = "PIN_IDENTITY_DATABASE_URL: {} (`pin-identity db grants` says what each job needs)"
_BROKER_FAILURES = {
    BrokerFailure.UNREACHABLE: "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS: broker unreachable ({})",
    BrokerFailure.REFUSED: "PIN_IDENTITY_KAFKA_CONFIG: the broker refused the client ({})",
    BrokerFailure.REPLICATION: "PIN_IDENTITY_KAFKA_REPLICATION_FACTOR: the broker refused it ({})",
    BrokerFailure.PARTITIONS: "PIN_IDENTITY_KAFKA_TOPIC_PARTITIONS: the broker refused it ({})",
}
# libpq's own failures carry no SQLSTATE; 08 is the connection class, 57P the server going away.
_CONNECTION_SQLSTATES = ("08", "57P")


def dependency_error(exc: BaseException) -> ConfigurationError | None:
    """An unexpected failure of the database or the broker as one line naming the variable to check, or
    None for anything else: a statement timeout, a constraint or a bug must not pass for a configuration
    problem."""
    for cause in _causes(exc):
        failure = broker_failure(cause)
        if failure is not None:
            kind, reason = failure
            return ConfigurationError(_BROKER_FAILURES[kind].format(reason))
        if isinstance(cause, psycopg.errors.InsufficientPrivilege):
            return ConfigurationError(_DATABASE_REFUSED.format(first_line(cause)))
        if isinstance(cause, psycopg.OperationalError) and (
            cause.sqlstate is None or cause.sqlstate.startswith(_CONNECTION_SQLSTATES)
        ):
            return ConfigurationError(_DATABASE_UNREACHABLE.format(first_line(cause)))
    return None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it explicitly wraps (SQLAlchemy raises its error `from` the driver's). Not
    `__context__`: a bug while handling a lost connection is still a bug."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__

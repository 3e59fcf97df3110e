"""The operator's use cases (the CLI's commands and the HTTP API's routes), each connected to what it reads
and writes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from uuid import UUID

from pin_identity.adapters.kafka.access_log import KafkaAccessLog
from pin_identity.adapters.kafka.access_lookup import KafkaUserAccessLog
from pin_identity.adapters.kafka.denials import is_denial
from pin_identity.adapters.kafka.group_lag import KafkaConsumerLag
from pin_identity.adapters.kafka.partitioning import UnsupportedPartitionerError
from pin_identity.adapters.kafka.reader import TopicReader
from pin_identity.adapters.kafka.topics import BrokerFailure
from pin_identity.adapters.postgres.access_truth import PostgresAccessTruth
from pin_identity.adapters.postgres.retention import PostgresRetention
from pin_identity.composition.connections import Connections
from pin_identity.composition.failures import broker_failure_line
from pin_identity.composition.jobs import Jobs
from pin_identity.composition.stores import Stores
from pin_identity.config import ConfigurationError
from pin_identity.domain.access_verdicts import AuditReport
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import BrokerUnavailableError, SourceUnavailableError
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.import_run import ImportMode
from pin_identity.operations.access_audit import audit_access
from pin_identity.operations.access_show import show_access
from pin_identity.operations.documents import UserAccessReport
from pin_identity.operations.fanout_admin import FanOutAdmin
from pin_identity.operations.health_reads import HealthReads, QueueGaugeReads
from pin_identity.operations.import_admin import ImportOperations
from pin_identity.operations.ports.access_reads import Progress
from pin_identity.operations.ports.talent_sources import TalentSource
from pin_identity.operations.retention_admin import RetentionAdmin
from pin_identity.operations.role_admin import RoleAdmin


@dataclass
class UseCases:
    connections: Connections
    stores: Stores
    jobs: Jobs
    clock: Clock

    @property
    def fanout_policy(self) -> FanOutPolicy:
        return FanOutPolicy(self.connections.settings.inline_fanout_threshold)

    @cached_property
    def imports(self) -> ImportOperations:
        stores = self.stores
        return ImportOperations(
            stores.import_store,
            stores.run_lock,
            self._operator_source,
            stores.replica_transactions,
            self.clock,
            summaries=stores.admin_reads,
        )

    def _operator_source(self, mode: ImportMode) -> TalentSource:
        """A source for starting a run: TopicReplay's is the broker, so an unreachable one is said in seconds
        and one line rather than after librdkafka's retries and log lines."""
        if mode is ImportMode.TOPIC_REPLAY:
            try:
                self.connections.require_broker()
            except ConfigurationError as exc:
                raise SourceUnavailableError(str(exc)) from None
        return self.jobs.import_source(mode)

    @cached_property
    def fanout_admin(self) -> FanOutAdmin:
        return FanOutAdmin(self.stores.fanout_queue, self.clock)

    @cached_property
    def role_admin(self) -> RoleAdmin:
        return RoleAdmin(
            self.stores.identity_transactions, self.fanout_policy, self.stores.admin_reads, self.clock
        )

    @cached_property
    def retention(self) -> RetentionAdmin:
        return RetentionAdmin(PostgresRetention(self.stores.database), self.clock)

    @cached_property
    def health(self) -> HealthReads:
        settings = self.connections.settings
        topics = (settings.talent_tenants_topic, settings.talent_users_topic)
        lags = KafkaConsumerLag(self._lag_client_config)
        return HealthReads(self.stores.admin_reads, lags, settings.talent_sync_group, topics)

    def queue_gauges(self) -> QueueGaugeReads:
        """The database gauges' reads (`/metrics`, the console's health summary), each caller with an outbox
        session of its own; the stores are reached at the first read, not here."""
        stores = self.stores
        return QueueGaugeReads(
            stores.outbox_backlog_reader, lambda: stores.fanout_queue, lambda: stores.import_store, self.clock
        )

    def _lag_client_config(self) -> dict[str, str]:
        """Without a broker to ask, the health summary says the lag is unknown rather than failing whole."""
        try:
            return self.connections.kafka_client_config
        except ConfigurationError as exc:
            raise BrokerUnavailableError(str(exc)) from None

    def access_audit(self, progress: Progress) -> AuditReport:
        """BrokerUnavailableError naming the variable to check when the broker stops answering midway (at
        the start it is the configuration failure every command gives)."""
        truth = PostgresAccessTruth(self.stores.database)
        self.connections.require_broker()
        try:
            return audit_access(KafkaAccessLog(self.connections.kafka_client_config), truth, progress)
        except BrokerUnavailableError as exc:
            raise self._naming_the_variable(exc) from None

    def access_show(self, user_id: UUID) -> UserAccessReport:
        """NotFoundError for an unknown user; BrokerUnavailableError naming the variable to check when the
        broker does not answer; ConfigurationError when PIN_IDENTITY_KAFKA_CONFIG sets a partitioner whose
        placement cannot be computed."""
        try:
            log = KafkaUserAccessLog(self.connections.kafka_client_config)
        except UnsupportedPartitionerError as exc:
            raise ConfigurationError(f"PIN_IDENTITY_KAFKA_CONFIG: {exc}") from None
        try:
            return show_access(log, PostgresAccessTruth(self.stores.database), user_id)
        except BrokerUnavailableError as exc:
            raise self._naming_the_variable(exc) from None

    def _naming_the_variable(self, exc: BrokerUnavailableError) -> BrokerUnavailableError:
        failure = BrokerFailure.REFUSED if is_denial(str(exc)) else BrokerFailure.UNREACHABLE
        return BrokerUnavailableError(broker_failure_line(self.connections.settings, failure, exc))

    def topic_reader(self, topics: Iterable[str]) -> TopicReader:
        """Reads what is published to `topics` from now on (the demo reads its events back)."""
        return TopicReader(self.connections.kafka_client_config, topics)

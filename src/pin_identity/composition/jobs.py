"""The jobs a worker runs, each connected to its store and its broker client: the outbox relay, the access
fan-out, talent-sync and the initial import (with its sources)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from pin_identity.adapters.kafka.publisher import KafkaEventPublisher
from pin_identity.adapters.kafka.replay_source import TopicReplaySource
from pin_identity.adapters.kafka.talent_stream import KafkaTalentStream
from pin_identity.adapters.kafka.topics import EVENT_MAX_BYTES, replication_shortfall, write_limits
from pin_identity.adapters.postgres.database import SilenceLimit
from pin_identity.adapters.postgres.fanout_queue import PostgresTaskWakeups
from pin_identity.adapters.postgres.outbox_queue import PostgresOutboxQueue
from pin_identity.adapters.talent_http.client import TalentApiClient
from pin_identity.adapters.talent_http.source import ApiPullSource
from pin_identity.composition.connections import Connections
from pin_identity.composition.stores import Stores
from pin_identity.config import (
    ConfigurationError,
    ImportSettings,
    RelaySettings,
    Settings,
    TalentSyncSettings,
)
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import SourceNotConfiguredError
from pin_identity.domain.events import PUBLISHED_TOPICS
from pin_identity.domain.import_run import ImportMode
from pin_identity.jobs.access_fanout import AccessFanOutJob
from pin_identity.jobs.outbox_relay import OutboxRelay
from pin_identity.jobs.outbox_relay_observer import RelayObserver
from pin_identity.jobs.talent_import import TalentImportJob
from pin_identity.jobs.talent_sync import TalentSyncJob
from pin_identity.jobs.talent_sync_observer import TalentSyncObserver
from pin_identity.operations.ports.import_records import RunLock
from pin_identity.operations.ports.talent_sources import TalentSource


@dataclass
class Jobs:
    connections: Connections
    stores: Stores
    clock: Clock
    _relay_queues: list[PostgresOutboxQueue] = field(default_factory=list)

    @property
    def settings(self) -> Settings:
        return self.connections.settings

    def outbox_relay(
        self, settings: RelaySettings | None = None, observer: RelayObserver | None = None
    ) -> OutboxRelay:
        settings = settings or self.settings.relay
        # The session's limit is the process's (PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S) whatever a caller tunes.
        silence = SilenceLimit(self.settings.relay.session_timeout_s)
        queue = PostgresOutboxQueue(self.stores.database, silence)
        self._relay_queues.append(queue)
        config = self.connections.kafka_client_config
        publisher = KafkaEventPublisher(
            config,
            ensure_topics=self.connections.ensure_topics
            if self.settings.outbox_relay_creates_topics
            else None,
            own_topics=PUBLISHED_TOPICS,
            transactional_id=self._transactional_id(queue),
            replication_shortfall=self._replication_shortfall,
            write_limits=partial(write_limits, config, PUBLISHED_TOPICS),
            # The relay hands the producer at most flight_bytes (or one event larger, alone): its queue never
            # fills, and a producer that cannot send holds no more than that.
            queue_kbytes=(settings.flight_bytes + EVENT_MAX_BYTES) // 1024,
        )
        self.connections.closers += [publisher.close, queue.reset]
        return OutboxRelay(queue, publisher, settings, observer, clock=self.clock)

    def _transactional_id(self, queue: PostgresOutboxQueue) -> str:
        # One transactional.id per outbox: the relay that takes over fences every producer before it. An
        # operator may set one in PIN_IDENTITY_KAFKA_CONFIG (a cluster whose ACLs grant a prefix); it must
        # then be this outbox's alone.
        return self.settings.kafka_properties.get("transactional.id") or queue.transactional_id()

    def _replication_shortfall(self) -> str | None:
        return replication_shortfall(self.connections.kafka_client_config, PUBLISHED_TOPICS)

    def relay_stalled(self) -> bool:
        """Whether a relay of this process has waited on its database session for longer than
        PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S: its path went silent where its TCP sees nothing wrong."""
        return any(queue.stalled() for queue in self._relay_queues)

    def access_fanout(self) -> AccessFanOutJob:
        wakeups = PostgresTaskWakeups(self.stores.database)
        return AccessFanOutJob(self.stores.fanout_queue, wakeups, self.settings.fanout, clock=self.clock)

    def talent_sync(
        self, settings: TalentSyncSettings | None = None, observer: TalentSyncObserver | None = None
    ) -> TalentSyncJob:
        stream = KafkaTalentStream(
            self.connections.kafka_client_config,
            tenants_topic=self.settings.talent_tenants_topic,
            users_topic=self.settings.talent_users_topic,
            overrides={"group.id": self.settings.talent_sync_group},
        )
        chosen = settings or self.settings.talent_sync
        replica = self.stores.replica_transactions
        return TalentSyncJob(stream, replica, chosen, clock=self.clock, observer=observer)

    def talent_import(
        self,
        lock: RunLock | None = None,
        *,
        settings: ImportSettings | None = None,
        sources: Callable[[ImportMode], TalentSource] | None = None,
    ) -> TalentImportJob:
        """The import job on this process's stores and clock. A test tunes its settings or reads Talent its
        own way (`sources`) and keeps the rest of the wiring."""
        return TalentImportJob(
            self.stores.import_store,
            lock or self.stores.run_lock(),
            sources or self.import_source,
            settings or self.settings.imports,
            self.clock,
        )

    def talent_source(self, mode: ImportMode) -> TalentSource:
        """Where an import reads Talent: the compacted topics, or the HTTP API."""
        if mode is ImportMode.TOPIC_REPLAY:
            return TopicReplaySource(
                self.connections.kafka_client_config,
                tenants_topic=self.settings.talent_tenants_topic,
                users_topic=self.settings.talent_users_topic,
                group_id=self.settings.talent_sync_group,
            )
        if not self.settings.talent_api_url:
            raise ConfigurationError("PIN_IDENTITY_TALENT_API_URL: required for the api-pull import")
        return ApiPullSource(TalentApiClient(self.settings.talent_api_url, self.settings.talent_api_token))

    def import_source(self, mode: ImportMode) -> TalentSource:
        """The source of a run's mode; one this process cannot read is the run's failure, not a crash."""
        try:
            return self.talent_source(mode)
        except ConfigurationError as exc:
            raise SourceNotConfiguredError(str(exc)) from None

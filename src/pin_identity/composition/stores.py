"""The PostgreSQL adapters on one process's pool: what the jobs and the use cases keep their state in."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pin_identity.adapters.postgres.admin_reads import PostgresAdminReads
from pin_identity.adapters.postgres.database import Database
from pin_identity.adapters.postgres.demo_data import PostgresDemoReads
from pin_identity.adapters.postgres.fanout_queue import PostgresFanOutQueue
from pin_identity.adapters.postgres.identity_store import PostgresIdentityTransactions
from pin_identity.adapters.postgres.import_store import PostgresImportStore, PostgresRunLock
from pin_identity.adapters.postgres.outbox_queue import PostgresOutboxQueue
from pin_identity.adapters.postgres.replica_store import PostgresReplicaTransactions
from pin_identity.composition.connections import Connections
from pin_identity.operations.ports.outbox import OutboxBacklogSession


@dataclass
class Stores:
    connections: Connections

    @property
    def database(self) -> Database:
        return self.connections.database

    @cached_property
    def identity_transactions(self) -> PostgresIdentityTransactions:
        """The identity schema's (companies, users, roles, assignments): the Talent replica has its own."""
        return PostgresIdentityTransactions(self.database)

    @cached_property
    def replica_transactions(self) -> PostgresReplicaTransactions:
        return PostgresReplicaTransactions(self.database)

    @cached_property
    def fanout_queue(self) -> PostgresFanOutQueue:
        return PostgresFanOutQueue(self.database)

    @cached_property
    def import_store(self) -> PostgresImportStore:
        return PostgresImportStore(self.database)

    @cached_property
    def admin_reads(self) -> PostgresAdminReads:
        return PostgresAdminReads(self.database)

    @cached_property
    def demo_reads(self) -> PostgresDemoReads:
        return PostgresDemoReads(self.database)

    def run_lock(self) -> PostgresRunLock:
        """The single-run lock on a session of its own (each holder its own)."""
        return PostgresRunLock(self.database)

    def outbox_backlog_reader(self) -> OutboxBacklogSession:
        """A session of its own for reading the outbox backlog (`/metrics`); `reset()` closes it."""
        return PostgresOutboxQueue(self.database)

"""The Talent replica, read and written in batches by the continuous consumer and the initial import: one
port a step of the apply takes (its reads, its rows, the default roles, the events, the quarantine), and the
transaction that holds them all."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeAlias
from uuid import UUID

from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.model import RenderedAccessSnapshot
from pin_identity.domain.talent import TalentItem
from pin_identity.operations.ports.access_events import AccessEventWriter
from pin_identity.operations.ports.identity_records import RoleRecord
from pin_identity.operations.ports.transactions import Transaction, Transactions


@dataclass(frozen=True)
class DefaultGrant:
    """The developer-manager role in the user's own organization (created with the user, or re-granted)."""

    assignment_id: UUID
    user_id: UUID
    company_id: UUID


@dataclass(frozen=True)
class QuarantineEntry:
    """A row of talent_import_failed_items; run_id None: quarantined by the continuous consumer."""

    entry_id: UUID
    run_id: UUID | None
    stage: str
    external_id: UUID | None
    error_code: str
    payload: Any
    attempt_count: int
    next_attempt_at: datetime | None
    reason: str | None = None  # what was wrong, in words, naming the field but never quoting its value


@dataclass(frozen=True)
class SourceItem:
    """A Talent item to apply; a quarantine row read back for another try carries its id, how often it was
    tried and, for one the consumer deferred until its tenant arrives, when it is due again."""

    item: TalentItem
    quarantine_id: UUID | None = None
    attempts: int = 0
    deferred_until: datetime | None = None


@dataclass(frozen=True)
class Quarantined:
    """Quarantine rows read back for a replay: the items to apply again, and the ids of rows kept without
    their snapshot (pruned past retention, or never storable), which nothing can apply."""

    items: list[SourceItem]
    without_snapshot: list[UUID]


class DryRunMemory(Protocol):
    """What a dry run would have written so far (it writes no replica row): the companies and users as it
    would have left them, and who would hold a phone. Its later pages decide against the replica with these
    over it, so that they decide as a real run's would (a repeated snapshot skipped, a later deletion
    blocking what an earlier page would have created)."""

    def companies(self, tenant_ids: Sequence[UUID]) -> dict[UUID, CompanyState]:
        """By Talent tenant id."""
        ...

    def users(self, talent_ids: Sequence[UUID]) -> dict[UUID, UserState]:
        """By Talent user id."""
        ...

    def phones(self, phones: Sequence[str]) -> dict[str, UUID]:
        """Phone -> the Talent user id that would hold it."""
        ...

    def remember(
        self, stage: str, states: Mapping[UUID, CompanyState | UserState], phones: Mapping[str, UUID]
    ) -> None:
        """`states` by Talent id (of the stage's entities); `phones`: phone -> Talent user id."""
        ...


class ReplicaReads(Protocol):
    """What deciding a round's items reads of the replica (operations/talent_decisions.py)."""

    def companies_by_tenant(
        self, tenant_ids: Sequence[UUID], *, shared: bool = False
    ) -> dict[UUID, CompanyState]: ...
    def users_by_talent_id(self, talent_ids: Sequence[UUID], *, lock: bool) -> dict[UUID, UserState]: ...
    def phone_owners(self, phones: Sequence[str]) -> dict[str, UUID]: ...
    def deleted_versions(self, stage: str, talent_ids: Sequence[UUID]) -> dict[UUID, int]:
        """Versions of deletions seen while these entities were absent from the replica."""
        ...

    def waiting_versions(self, stage: str, talent_ids: Sequence[UUID]) -> dict[UUID, int]:
        """The oldest version of each entity's snapshots the consumer deferred until their tenant arrives."""
        ...


class ReplicaRows(Protocol):
    """The replica's companies and users written as a round decided them (operations/talent_writes.py)."""

    def pipelined(self) -> AbstractContextManager[None]:
        """A block whose statements are sent without waiting for each one's answer (the caller's work goes on
        while the database writes); a statement's failure surfaces by the end of the block at the latest."""
        ...

    def save_companies(
        self, created: Sequence[CompanyState], updated: Sequence[CompanyState], synced_at: datetime
    ) -> None: ...
    def save_users(
        self, created: Sequence[UserState], updated: Sequence[UserState], synced_at: datetime
    ) -> None: ...
    def remember_deletions(self, stage: str, versions: Mapping[UUID, int]) -> None: ...
    def wake_deferred(self, tenant_ids: Sequence[UUID], now: datetime) -> None:
        """Make the consumer's users deferred until one of these tenants arrived due at `now`."""
        ...


class DefaultRoles(Protocol):
    """A Talent manager's default role, following its user and its company (operations/talent_writes.py)."""

    def default_role(self) -> RoleRecord: ...
    def lock_managers(self, company_ids: Sequence[UUID]) -> dict[UUID, UUID]:
        """The companies' live Talent managers (user id -> company id), locked as their writers lock them."""

    def managers_without_default_role(
        self, user_ids: Sequence[UUID], role_id: UUID
    ) -> list[tuple[UUID, UUID]]:
        """(user id, company id) of those of the users without an Active default role in their company."""

    def revoke_user_assignments(
        self, user_ids: Sequence[UUID], role_id: UUID | None
    ) -> list[tuple[UUID, UUID]]:
        """Revokes the users' Active assignments (of one role, or all); returns (user, role) pairs revoked."""
        ...

    def grant_default_role(self, role: RoleRecord, grants: Sequence[DefaultGrant]) -> None: ...


class ReplicaEvents(AccessEventWriter, Protocol):
    """The events of a round's writes: UserAccessChanged rendered in bulk, beside the writer every access
    change shares."""

    def access_changes(self, user_ids: Sequence[UUID]) -> dict[UUID, tuple[RenderedAccessSnapshot, int]]:
        """Each user's access snapshot (activeAssignments rendered) and point version, read in one go."""
        ...


class ReplicaWrites(ReplicaRows, DefaultRoles, ReplicaEvents, Protocol):
    """Everything a round's writes take: its rows, its managers' default roles, their events."""


class QuarantineRows(Protocol):
    """talent_import_failed_items: written as a round's items came to (operations/talent_round.py), read back
    for the consumer's retries and the operator's replays (operations/talent_replica.py)."""

    def quarantine(self, entries: Sequence[QuarantineEntry]) -> None: ...
    def release_quarantined(self, entry_ids: Sequence[UUID]) -> None: ...
    def discard_quarantined(self, stage: str, talent_ids: Sequence[UUID]) -> None:
        """Drop every quarantined snapshot of these entities, from every quarantine (a tombstone deleted
        them)."""
        ...

    def due_quarantined(self, now: datetime, limit: int) -> list[SourceItem]:
        """Every deferred item of the consumer's (at most `limit`) entities with one due, each entity's in
        version order, locked for this transaction."""
        ...

    def quarantined_for_replay(self, run_id: UUID | None, entry_ids: Sequence[UUID] | None) -> Quarantined:
        """A run's quarantine rows (the chosen ones, or all), locked for this transaction."""
        ...


class ReplicaTransaction(ReplicaReads, ReplicaWrites, QuarantineRows, Transaction, Protocol):
    """One transaction over the Talent replica, as the use case (operations/talent_replica.py) holds it;
    batch-shaped, so a page costs a handful of statements. Each step below the use case takes the narrow
    port it uses."""

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested block; a unique violation inside it rolls it back and raises StoreConflictError."""
        ...

    def lock_talent_ids(self, stage: str, talent_ids: Sequence[UUID]) -> None: ...


ReplicaTransactions: TypeAlias = Transactions[ReplicaTransaction]

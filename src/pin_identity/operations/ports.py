"""What the use cases need from storage and from Talent; the adapters implement it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol
from uuid import UUID

from pin_identity.domain.events import CompanyState, OutboxMessage, UserState
from pin_identity.domain.model import (
    FanOutTaskStatus,
    RenderedAccessSnapshot,
    RoleStatus,
    Scope,
    UserAccessSnapshot,
)
from pin_identity.domain.talent import TalentItem
from pin_identity.domain.talent_import import ImportRequest, ImportRun, PageProgress
from pin_identity.operations.read_models import (
    DeadLetters,
    FailedItemView,
    FanOutTaskView,
    PartitionLag,
    Pruned,
    RoleSummary,
    RunSummary,
)


@dataclass(frozen=True)
class RoleRecord:
    role_id: UUID
    code: str
    company_id: UUID | None
    status: RoleStatus
    version: int


@dataclass(frozen=True)
class AssignmentRecord:
    user_id: UUID
    role_id: UUID
    active: bool


class AccessEventWriter(Protocol):
    """What writing UserAccessChanged events takes, inside any transaction that changed access."""

    def access_snapshots(self, user_ids: Sequence[UUID]) -> list[UserAccessSnapshot]: ...
    def access_versions(self, user_ids: Sequence[UUID]) -> dict[UUID, int]: ...
    def add_events(self, messages: Sequence[OutboxMessage]) -> None: ...


class IdentityTransaction(Protocol):
    """One open transaction; nothing is visible to others until commit()."""

    def commit(self) -> None: ...

    def insert_company(self, company: CompanyState) -> None: ...
    def insert_user(self, user: UserState) -> None: ...
    def lock_user(self, user_id: UUID) -> bool: ...
    def lock_users_of_role(self, role_id: UUID) -> None: ...

    def insert_role(self, role_id: UUID, code: str, name: str, company_id: UUID | None) -> None: ...
    def lock_role(self, role_id: UUID, *, shared: bool = False) -> RoleRecord | None: ...
    def replace_role_permissions(self, role_id: UUID, codes: Sequence[str], version: int) -> None: ...
    def archive_role(self, role_id: UUID, version: int) -> None: ...

    def next_assignment_version(self, user_id: UUID) -> int: ...
    def insert_assignment(
        self,
        *,
        assignment_id: UUID,
        role: RoleRecord,
        user_id: UUID,
        scope: Scope,
        expires_at: datetime | None,
        version: int,
    ) -> None: ...
    def holds(self, user_id: UUID, role_id: UUID, scope: Scope) -> bool:
        """Whether the user already has this role Active in this scope."""

    def assignment(self, assignment_id: UUID) -> AssignmentRecord | None: ...
    def revoke_assignment(self, assignment_id: UUID, version: int) -> None: ...
    def revoke_role_assignments(self, role_id: UUID) -> list[UUID]: ...
    def access_versions(self, user_ids: Sequence[UUID]) -> dict[UUID, int]: ...

    def count_active_users(self, role_id: UUID, limit: int) -> int: ...
    def lock_active_users(self, role_id: UUID) -> list[UUID]:
        """The role's users, in id order, locked against changes of their assignments until commit."""

    def access_snapshots(self, user_ids: Sequence[UUID]) -> list[UserAccessSnapshot]: ...

    def enqueue_fanout_task(self, role: RoleRecord, role_version: int, now: datetime) -> UUID: ...
    def add_events(self, messages: Sequence[OutboxMessage]) -> None: ...


class IdentityTransactions(Protocol):
    """Opens a transaction; leaving the block without commit() rolls it back."""

    def __call__(self) -> AbstractContextManager[IdentityTransaction]: ...


# ---------------------------------------------------------------- Talent replica


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
    """A Talent item to apply; a quarantine row read back for another try carries its id and how often it
    was tried."""

    item: TalentItem
    quarantine_id: UUID | None = None
    attempts: int = 0


class DryRunMemory(Protocol):
    """What a dry run would have written so far (it writes no replica row): its later pages resolve tenants
    and phone owners against the replica plus this."""

    def tenants(self, tenant_ids: Sequence[UUID]) -> set[UUID]: ...
    def phones(self, phones: Sequence[str]) -> dict[str, UUID]:
        """Phone -> the Talent user id that would hold it."""
        ...

    def remember(self, tenant_ids: Sequence[UUID], phones: Mapping[str, UUID]) -> None: ...


class ReplicaTransaction(Protocol):
    """One transaction over the Talent replica; batch-shaped, so a page costs a handful of statements."""

    def commit(self) -> None: ...
    def savepoint(self) -> AbstractContextManager[None]:
        """A nested block; a unique violation inside it rolls it back and raises StoreConflictError."""
        ...

    def pipelined(self) -> AbstractContextManager[None]:
        """A block whose statements are sent without waiting for each one's answer (the caller's work goes on
        while the database writes); a statement's failure surfaces by the end of the block at the latest."""
        ...

    def lock_talent_ids(self, stage: str, talent_ids: Sequence[UUID]) -> None: ...
    def companies_by_tenant(
        self, tenant_ids: Sequence[UUID], *, shared: bool = False
    ) -> dict[UUID, CompanyState]: ...
    def lock_managers(self, company_ids: Sequence[UUID]) -> dict[UUID, UUID]:
        """The companies' live Talent managers (user id -> company id), locked as their writers lock them."""

    def managers_without_default_role(
        self, user_ids: Sequence[UUID], role_id: UUID
    ) -> list[tuple[UUID, UUID]]:
        """(user id, company id) of those of the users without an Active default role in their company."""

    def users_by_talent_id(self, talent_ids: Sequence[UUID], *, lock: bool) -> dict[UUID, UserState]: ...
    def phone_owners(self, phones: Sequence[str]) -> dict[str, UUID]: ...
    def default_role(self) -> RoleRecord: ...
    def deleted_versions(self, stage: str, talent_ids: Sequence[UUID]) -> dict[UUID, int]:
        """Versions of deletions seen while these entities were absent from the replica."""
        ...

    def remember_deletions(self, stage: str, versions: Mapping[UUID, int]) -> None: ...

    def save_companies(
        self, created: Sequence[CompanyState], updated: Sequence[CompanyState], synced_at: datetime
    ) -> None: ...
    def save_users(
        self, created: Sequence[UserState], updated: Sequence[UserState], synced_at: datetime
    ) -> None: ...
    def revoke_user_assignments(
        self, user_ids: Sequence[UUID], role_id: UUID | None
    ) -> list[tuple[UUID, UUID]]:
        """Revokes the users' Active assignments (of one role, or all); returns (user, role) pairs revoked."""
        ...

    def access_changes(self, user_ids: Sequence[UUID]) -> dict[UUID, tuple[RenderedAccessSnapshot, int]]:
        """Each user's access snapshot (activeAssignments rendered) and point version, read in one go."""
        ...

    def grant_default_role(self, role: RoleRecord, grants: Sequence[DefaultGrant]) -> None: ...
    def access_versions(self, user_ids: Sequence[UUID]) -> dict[UUID, int]: ...
    def access_snapshots(self, user_ids: Sequence[UUID]) -> list[UserAccessSnapshot]: ...

    def quarantine(self, entries: Sequence[QuarantineEntry]) -> None: ...
    def due_quarantined(self, now: datetime, limit: int) -> list[SourceItem]:
        """The consumer's deferred items whose next try is due, locked for this transaction."""
        ...

    def quarantined_for_replay(
        self, run_id: UUID | None, entry_ids: Sequence[UUID] | None
    ) -> list[SourceItem]:
        """A run's quarantine rows (the chosen ones, or all), locked for this transaction."""
        ...

    def release_quarantined(self, entry_ids: Sequence[UUID]) -> None: ...
    def discard_deferred(self, stage: str, talent_ids: Sequence[UUID]) -> None:
        """Drop the consumer's deferred items of these entities (they were deleted in Talent)."""
        ...

    def add_events(self, messages: Sequence[OutboxMessage]) -> None: ...


class ReplicaTransactions(Protocol):
    def __call__(self) -> AbstractContextManager[ReplicaTransaction]: ...


# ---------------------------------------------------------------- operator actions


class SourceCheck(Protocol):
    """What starting a run asks of its source before anything is written (a TalentSource of the job)."""

    def check(self) -> None:
        """Raise SourceUnavailableError unless the source can be used."""
        ...

    def count_companies(self, tenant_filter: UUID | None) -> int | None:
        """How many companies the source lists within the scope, None if it cannot tell cheaply."""
        ...

    def close(self) -> None: ...


class RunLock(Protocol):
    """The one-run-per-cluster lock (a session-level PostgreSQL advisory lock)."""

    def try_acquire(self) -> bool: ...
    def held(self) -> bool:
        """False once the lock's session is gone (and with it the lock)."""
        ...

    def release(self) -> None: ...
    def holder(self) -> str | None: ...


class ImportRuns(Protocol):
    """The import runs as operators start, watch and steer them (the job's ImportStore does the rest)."""

    def running_run(self) -> ImportRun | None: ...
    def load_run(self, run_id: UUID) -> ImportRun | None: ...
    def latest_run(self) -> ImportRun | None: ...
    def create_run(self, request: ImportRequest, correlation_id: UUID, now: datetime) -> ImportRun: ...
    def replica_company_count(self, tenant_filter: UUID | None) -> int: ...
    def progress(self, run_id: UUID) -> PageProgress: ...
    def request_cancel(self, run_id: UUID) -> bool:
        """Running -> Cancelled; False when the run is not Running (or does not exist)."""
        ...

    def reset_leases(self, run_id: UUID) -> int:
        """Every InProgress page of the run becomes claimable now; returns how many."""
        ...

    def failed_items(self, run_id: UUID | None) -> list[FailedItemView]:
        """A run's quarantine, or the continuous consumer's (None), oldest first."""
        ...


class RunSummaries(Protocol):
    def recent_runs(self, limit: int) -> list[RunSummary]:
        """The newest first."""
        ...


class TaskReplay(StrEnum):
    """What asking for a fan-out task's replay did."""

    REPLAYED = "replayed"  # Failed -> Pending, AttemptCount 0
    NOT_FAILED = "not-failed"  # the task is in another status, or does not exist
    ROLE_HAS_PENDING_TASK = "role-has-pending-task"  # one Pending task per role: it notifies every user


class FanOutTasks(Protocol):
    def list_tasks(self, status: FanOutTaskStatus | None, limit: int) -> list[FanOutTaskView]:
        """The newest first."""
        ...

    def replay(self, task_id: UUID, now: datetime) -> TaskReplay: ...
    def task_status(self, task_id: UUID) -> FanOutTaskStatus | None: ...


class Retention(Protocol):
    def prune(self, cutoff: datetime) -> Pruned:
        """In one transaction: finished work and quarantine payloads last changed before the cutoff."""
        ...


class RoleSummaries(Protocol):
    def roles(
        self, *, role_id: UUID | None = None, code: str | None = None, limit: int = 100
    ) -> list[RoleSummary]:
        """One role by id, or roles by code, or the first `limit`: system roles first, then by company and
        code."""
        ...


# ---------------------------------------------------------------- health


class DeadLetterReads(Protocol):
    def dead_letters(self) -> DeadLetters: ...


class ConsumerLagReader(Protocol):
    """Read from the broker without joining the group: committed offsets against high watermarks."""

    def partition_lags(self, group: str, topics: Sequence[str]) -> list[PartitionLag]:
        """Every partition of those `topics` that exist; raises ConsumerLagUnavailableError."""
        ...

"""Import runs: operators start, watch and steer them (ImportRuns), the job plans and works their pages
(ImportStore); both read and create runs through what they share (ImportRunRecords)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol
from uuid import UUID

from pydantic import Field

from pin_identity.domain.api_model import ApiModel
from pin_identity.domain.import_run import (
    ImportMode,
    ImportPage,
    ImportRequest,
    ImportRun,
    PageProgress,
    PageStatus,
    PlanStep,
    RunEnding,
    RunStatus,
    StageCounters,
)
from pin_identity.domain.lease import Release
from pin_identity.domain.talent import ImportStage
from pin_identity.operations.ports.replica import DryRunMemory, ReplicaTransaction
from pin_identity.operations.ports.transactions import Transaction

# ---------------------------------------------------------------- what operators read of the runs


class StageCounts(ApiModel):
    planned: int
    applied: int
    skipped: int
    failed: int

    @classmethod
    def of(cls, counters: StageCounters) -> StageCounts:
        # The jobs count a page at a time in the domain's plain StageCounters; operators read them here.
        return cls(
            planned=counters.planned,
            applied=counters.applied,
            skipped=counters.skipped,
            failed=counters.failed,
        )


class ImportRunSummary(ApiModel):
    """A run in the list: its counters; `GET .../runs/{runId}` adds pages, ETA and the lock holder."""

    run_id: UUID
    mode: ImportMode
    status: RunStatus
    dry_run: bool
    talent_tenant_id_filter: UUID | None
    page_size: int
    companies: StageCounts
    users: StageCounts
    started_at: datetime
    finished_at: datetime | None
    error_code: str | None
    quarantined: int = Field(description="Items of this run in the quarantine now.")


class FailedItem(ApiModel):
    """A quarantined item; its payload stays in the database (it holds PII)."""

    item_id: UUID
    stage: ImportStage
    external_id: UUID | None = Field(description="The Talent tenant or user id.")
    error_code: str
    reason: str | None = Field(
        description="What was wrong, in words: the field and the rule, never the value."
    )
    attempts: int
    created_at: datetime
    updated_at: datetime


class ImportRunRecords(Protocol):
    """The import runs as stored: found, created, and their pages counted."""

    def running_run(self) -> ImportRun | None: ...
    def load_run(self, run_id: UUID) -> ImportRun | None: ...
    def latest_run(self) -> ImportRun | None: ...
    def create_run(self, request: ImportRequest, correlation_id: UUID, now: datetime) -> ImportRun: ...
    def replica_company_count(self, tenant_filter: UUID | None) -> int: ...
    def progress(self, run_id: UUID) -> PageProgress: ...


class ImportRuns(ImportRunRecords, Protocol):
    """The import runs as operators start, watch and steer them."""

    def request_cancel(self, run_id: UUID) -> bool:
        """Running -> Cancelled; False when the run is not Running (or does not exist)."""
        ...

    def reset_leases(self, run_id: UUID, now: datetime) -> int:
        """Every InProgress page of the run becomes claimable at `now`; returns how many."""
        ...

    def failed_items(self, run_id: UUID | None) -> list[FailedItem]:
        """A run's quarantine, or the continuous consumer's (None), oldest first."""
        ...


class ImportPageTransaction(Transaction, Protocol):
    """One page's transaction, already fenced (the page is still this claim's): the replica is written
    through `replica`, and commit() makes those writes and the page's completion visible together."""

    @property
    def replica(self) -> ReplicaTransaction: ...
    def complete_page(self, page: ImportPage, counters: StageCounters, *, count_planned: bool) -> None: ...
    def dry_run_memory(self, run_id: UUID) -> DryRunMemory: ...
    def talent_users_of_tenant(self, tenant_id: UUID, user_ids: Sequence[UUID]) -> set[UUID]: ...


class ImportStore(ImportRunRecords, Protocol):
    """The import runs as the job plans them into pages, leases the pages (under the rules of
    pin_identity.domain.lease, as FanOutQueue's tasks) and ends the runs."""

    def add_planned_pages(self, run: ImportRun, stage: ImportStage, step: PlanStep) -> bool:
        """False (nothing written) when the run's listing is no longer where `run` says it is."""
        ...

    def page_cursors(self, run_id: UUID, stage: ImportStage) -> list[str | None]: ...
    def stage_times(self, run_id: UUID, stage: ImportStage) -> tuple[datetime, datetime] | None:
        """When the stage's first page was listed and its last page ended (None: no page), for its span in
        the run's trace."""
        ...

    def finish_run(self, run_id: UUID, ending: RunEnding, now: datetime) -> bool:
        """False (nothing written) when the run is no longer Running."""
        ...

    def fail_exhausted(self, now: datetime, max_attempts: int) -> int:
        """Fails the pages of Running runs whose attempts are spent and that no one holds; how many."""
        ...

    def claim(
        self, claim_id: UUID, now: datetime, lease_until: datetime, run_id: UUID | None
    ) -> ImportPage | None:
        """A page of a Running run (of `run_id`'s only, if given), Tenants pages first."""
        ...

    def page_transaction(
        self, page: ImportPage, now: datetime, lease_until: datetime
    ) -> AbstractContextManager[ImportPageTransaction]:
        """Opens the page's transaction; raises LeaseLostError when the page is no longer this claim's."""
        ...

    def release(
        self, page: ImportPage, now: datetime, release: Release, max_attempts: int
    ) -> PageStatus | None:
        """Pending again at the release's `available_at`, or Failed when the counted attempt was the last;
        None when the page is no longer this claim's."""
        ...


class RunLock(Protocol):
    """The one-run-per-cluster lock (a session-level PostgreSQL advisory lock)."""

    def try_acquire(self) -> bool: ...
    def held(self) -> bool:
        """False once the lock's session is gone (and with it the lock)."""
        ...

    def release(self) -> None: ...
    def holder(self) -> str | None: ...


class RunSummaries(Protocol):
    def recent_runs(self, limit: int) -> list[ImportRunSummary]:
        """The newest first."""
        ...

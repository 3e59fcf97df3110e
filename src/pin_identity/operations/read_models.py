"""What operators read: a run with its progress, the list of runs, a quarantined item, a fan-out task, a role
with its size, what a prune removed, the health the console shows (the database gauges of `/metrics`, dead
letters, a consumer group's lag), and one user's access (`access show`).

The stores answer with these values and the operator service hands them on; the CLI and the HTTP API render
them (one JSON shape for both, in entrypoints.documents).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from pin_identity.domain.access_audit import AssignmentDifference, Verdict
from pin_identity.domain.model import FanOutTaskStatus, RoleStatus
from pin_identity.domain.talent import ImportStage
from pin_identity.domain.talent_import import (
    ImportMode,
    ImportRun,
    PageProgress,
    PageStatus,
    RunStatus,
    StageCounters,
)


@dataclass(frozen=True)
class ImportRunView:
    """A run as `talent-import status` and `GET .../runs/{runId}` show it."""

    run: ImportRun
    progress: PageProgress
    eta_seconds: float | None
    lock_holder: str | None  # the session holding the one-run lock, whichever run it works on
    as_of: datetime

    @property
    def duration_ms(self) -> int:
        end = self.run.finished_at or self.as_of
        return max(int((end - self.run.started_at).total_seconds() * 1000), 0)

    def pages(self, stage: ImportStage, status: PageStatus) -> int:
        return self.progress.count(stage, status)


def eta_seconds(run: ImportRun, progress: PageProgress, now: datetime) -> float | None:
    """From the pace of Done pages so far; unknown while the source is still being listed."""
    done, total = progress.count(status=PageStatus.DONE), progress.count()
    elapsed = (now - run.started_at).total_seconds()
    if run.status is not RunStatus.RUNNING or run.planning_stage is not None or not done or elapsed <= 0:
        return None
    return round((total - done) * elapsed / done, 1)


@dataclass(frozen=True)
class RunSummary:
    """A run in the list of runs: its counters and its quarantine now (ImportRunView adds pages and ETA)."""

    run_id: UUID
    mode: ImportMode
    status: RunStatus
    dry_run: bool
    tenant_filter: UUID | None
    page_size: int
    companies: StageCounters
    users: StageCounters
    started_at: datetime
    finished_at: datetime | None
    error_code: str | None
    quarantined: int  # items of this run in the quarantine now


@dataclass(frozen=True)
class FailedItemView:
    """A quarantined item; its payload stays in the database (it holds PII)."""

    item_id: UUID
    stage: ImportStage
    external_id: UUID | None  # the Talent tenant or user id
    error_code: str
    reason: str | None  # what was wrong, in words: the field and the rule, never the value
    attempts: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class FanOutTaskView:
    task_id: UUID
    role_id: UUID
    company_id: UUID | None
    role_version: int
    reason: str
    status: FanOutTaskStatus
    cursor: UUID | None
    processed_count: int
    attempt_count: int
    lease_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    updated_at: datetime
    last_error: str | None


@dataclass(frozen=True)
class Pruned:
    """What `maintenance prune` removed: rows of finished work, and quarantine payloads emptied."""

    fanout_tasks: int
    import_runs: int
    quarantine_payloads: int


@dataclass(frozen=True)
class Replayed:
    """Quarantined items applied again: applied ones left the quarantine, failed ones stay (new reason)."""

    applied: int
    skipped: int
    failed: int


@dataclass(frozen=True)
class RoleSummary:
    """A role with its permissions and its size."""

    role_id: UUID
    code: str
    name: str
    company_id: UUID | None  # None: a system role
    company_name: str | None
    status: RoleStatus
    version: int
    permissions: tuple[str, ...]
    holders: int  # users holding an Active assignment of the role: the size its fan-out counts


# ---------------------------------------------------------------- health: the console's summary


class OutboxHolder(Protocol):
    """A session whose transaction took an outbox id and has not ended: nothing after that id is published
    until it does (the outbox queue's OutboxWriter). Its figures are None where the reader's role may not
    see other roles' sessions."""

    @property
    def pid(self) -> int | None: ...
    @property
    def application_name(self) -> str | None: ...
    @property
    def transaction_s(self) -> float | None: ...


@dataclass(frozen=True)
class QueueGauges:
    """The gauges `/metrics` reads from the database for scrapes (at most every few seconds), read at one
    moment."""

    outbox_backlog: int  # rows not yet acknowledged
    outbox_oldest_age_s: float
    outbox_held_s: float  # how long the oldest running writer's transaction has run: publishing waits on it
    outbox_held_by: OutboxHolder | None
    fanout_backlog: int
    fanout_failed: int
    import_started_at: datetime | None  # of the Running import run; None when none runs


@dataclass(frozen=True)
class DeadLetters:
    """Events the broker refused for good (identity.outbox_dead_letters)."""

    count: int
    newest_failed_at: datetime | None


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    lag: int
    committed: int | None  # None: the group has committed nothing here (it would start from the beginning)


@dataclass(frozen=True)
class ConsumerLag:
    """How far a consumer group is behind on its topics, or why the broker did not say."""

    group: str
    partitions: tuple[PartitionLag, ...]
    error: str | None = None

    @property
    def total(self) -> int | None:
        """Records behind on every partition; None when the broker did not say."""
        return None if self.error is not None else sum(lag.lag for lag in self.partitions)


# ---------------------------------------------------------------- one user's access (`access show`)


@dataclass(frozen=True)
class LastAccessEvent:
    """A user's last record on the access topic. Fields its value did not carry readably are None; an
    unreadable `active_assignments` matches no truth."""

    partition: int
    offset: int
    event_id: str | None
    version: int | None
    change_reason: str | None
    changed_role_id: str | None
    occurred_at: datetime | None
    active_assignments: Any  # the event's activeAssignments as it was sent


@dataclass(frozen=True)
class AccessLogSearch:
    """Where the user's key goes on the access topic (None: the topic does not exist), how much of that
    partition was read from its end, and the user's last event there (None: not one since its beginning)."""

    partition: int | None
    records_read: int
    last_event: LastAccessEvent | None


@dataclass(frozen=True)
class QueuedAccessEvent:
    """A UserAccessChanged of the user still in the outbox, or refused by the broker for good (`error`)."""

    outbox_id: int
    event_id: UUID
    change_reason: str | None
    version: int | None
    queued_at: datetime
    error: str | None = None


@dataclass(frozen=True)
class UserAccessState:
    """The database's side, read in one snapshot."""

    user_id: UUID
    company_id: UUID | None
    active_assignments: list[dict[str, Any]]  # rendered as the event's activeAssignments
    waiting: tuple[QueuedAccessEvent, ...]  # in the outbox, oldest first
    dead_letters: tuple[QueuedAccessEvent, ...]


@dataclass(frozen=True)
class UserAccess:
    state: UserAccessState
    search: AccessLogSearch
    verdict: Verdict
    difference: AssignmentDifference


# ---------------------------------------------------------------- health: the summary as a whole


@dataclass(frozen=True)
class HealthReport:
    """The console's health summary: the database gauges of `/metrics`, dead letters, the consumer's lag."""

    queues: QueueGauges
    dead_letters: DeadLetters
    consumer_lag: ConsumerLag
    read_at: datetime

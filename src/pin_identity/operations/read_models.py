"""What operators read: a run with its progress, the list of runs, a quarantined item, a fan-out task, a role
with its size, what an action changed or removed, the health the console shows (the database gauges of
`/metrics`, dead letters, a consumer group's lag), and one user's access (`access show`).

The stores answer with these values and the operator service hands them on; each one that operators see is
its own document (an ApiModel): the HTTP API answers it and the CLI prints it with `--json`, in one shape.
Values the stores hand on only to be summed up into a document stay plain dataclasses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from pydantic import Field

from pin_identity.domain.access_verdicts import AssignmentDifferenceView, Verdict
from pin_identity.domain.api_model import ApiModel
from pin_identity.domain.fanout_policy import FanOutPath
from pin_identity.domain.import_run import (
    ImportMode,
    ImportRun,
    PageProgress,
    PageStatus,
    RunStatus,
    StageCounters,
)
from pin_identity.domain.model import FanOutTaskStatus, RoleStatus
from pin_identity.domain.talent import ImportStage

# ---------------------------------------------------------------- talent import


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


class ImportResult(ApiModel):
    """TalentInitialImportResult (CONTRACTS section 2): how a run ended, or stands."""

    run_id: UUID
    mode: ImportMode
    status: RunStatus
    dry_run: bool
    companies: StageCounts
    users: StageCounts
    duration_ms: int

    @staticmethod
    def of(run: ImportRun, now: datetime) -> ImportResult:
        """Only the result, whichever class it is called on: a report is built by ImportRunReport.of_run."""
        return ImportResult(**_result_fields(run, now))


def _result_fields(run: ImportRun, now: datetime) -> dict[str, Any]:
    end = run.finished_at or now
    return {
        "run_id": run.run_id,
        "mode": run.mode,
        "status": run.status,
        "dry_run": run.dry_run,
        "companies": StageCounts.of(run.companies),
        "users": StageCounts.of(run.users),
        "duration_ms": max(int((end - run.started_at).total_seconds() * 1000), 0),
    }


class ImportRunReport(ImportResult):
    """TalentInitialImportResult plus progress: `GET .../runs/{runId}` and `talent-import status --json`."""

    started_at: datetime
    finished_at: datetime | None
    planning: ImportStage | None = Field(description="The stage still being listed; null once both are.")
    pages: dict[str, dict[str, int]] = Field(
        description="Page counts by stage (`Tenants`, `Users`) and page status "
        "(`Pending`, `InProgress`, `Done`, `Failed`)."
    )
    eta_seconds: float | None
    lock_holder: str | None = Field(description="The session holding the single-run lock, if any.")
    error_code: str | None
    error: str | None
    # Shown to people by `talent-import status`, never part of the document.
    correlation_id: UUID = Field(exclude=True)

    @classmethod
    def of_run(
        cls, run: ImportRun, progress: PageProgress, lock_holder: str | None, now: datetime
    ) -> ImportRunReport:
        """`lock_holder`: the session holding the one-run lock, whichever run it works on."""
        return cls(
            **_result_fields(run, now),
            started_at=run.started_at,
            finished_at=run.finished_at,
            planning=run.planning_stage,
            pages={
                stage.value: {status.value: progress.count(stage, status) for status in PageStatus}
                for stage in ImportStage
            },
            eta_seconds=eta_seconds(run, progress, now),
            lock_holder=lock_holder,
            error_code=run.error_code,
            error=run.error,
            correlation_id=run.correlation_id,
        )

    def page_count(self, stage: ImportStage, status: PageStatus) -> int:
        return self.pages[stage.value][status.value]


def eta_seconds(run: ImportRun, progress: PageProgress, now: datetime) -> float | None:
    """From the pace of Done pages so far; unknown while the source is still being listed."""
    done, total = progress.count(status=PageStatus.DONE), progress.count()
    elapsed = (now - run.started_at).total_seconds()
    if run.status is not RunStatus.RUNNING or run.planning_stage is not None or not done or elapsed <= 0:
        return None
    return round((total - done) * elapsed / done, 1)


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


# Quarantined items applied again: applied ones left the quarantine, failed ones stay (new reason); those kept
# without their snapshot (pruned past retention) cannot be applied, and stay as they are.
class ReplayResult(ApiModel):
    applied: int
    skipped: int
    failed: int
    not_replayable: int = Field(
        description="Items kept without their snapshot (pruned past retention): not applied, left as they are"
    )


# ---------------------------------------------------------------- access fan-out and roles


# A fan-out task as operators list it; the claimed task the job works on is ports.fanout_tasks.FanOutTask. Its
# OpenAPI schema keeps the name clients know, FanOutTask. (No docstring: it would become the schema's
# description.)
class FanOutTaskView(ApiModel, schema_name="FanOutTask"):
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


# A role with its permissions and its size.
class RoleView(ApiModel):
    """`GET /admin/v1/roles[/{roleId}]`, `roles list|show --json`."""

    role_id: UUID
    code: str
    name: str
    company_id: UUID | None = Field(description="Null for a system role.")
    company_name: str | None
    status: RoleStatus
    version: int
    permissions: list[str]
    holders: int = Field(description="Users holding an Active assignment of the role: its fan-out size.")


# set-role-permissions' answer: how the role's users are told.
class PermissionsChanged(ApiModel):
    role_id: UUID
    role_version: int
    path: FanOutPath = Field(description="`inline`: events written now; `queued`: a fan-out task.")
    users_notified_inline: int
    task_id: UUID | None = Field(description="The enqueued fan-out task (path `queued`).")


# ---------------------------------------------------------------- retention


class PruneResult(ApiModel):
    """What `maintenance prune` removed: rows of finished work, and quarantine payloads emptied."""

    fanout_tasks: int = Field(
        description="Completed fan-out tasks deleted (a Failed one stays until replayed or discarded)."
    )
    import_runs: int = Field(description="Finished import runs deleted, with their pages and quarantine.")
    quarantine_payloads: int = Field(description="Quarantined snapshots (PII) emptied.")


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
    @property
    def prepared_gid(self) -> str | None: ...


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
    # The Running run's counters by aggregate (`company`, `user`); empty when none runs.
    import_counters: Mapping[str, StageCounters] = field(default_factory=dict)


@dataclass(frozen=True)
class DeadLetters:
    """Events the broker refused for good (identity.outbox_dead_letters)."""

    count: int
    newest_failed_at: datetime | None


class PartitionLagView(ApiModel):
    topic: str
    partition: int
    lag: int
    committed_offset: int | None = Field(description="Null when the group has committed nothing there.")


# How far a consumer group is behind on its topics, or why the broker did not say. (A docstring would be the
# document's description in the OpenAPI schema, which has none.)
class ConsumerLag(ApiModel):
    group: str
    total: int | None = Field(
        description="Records behind on Talent's topics; null when the broker did not say."
    )
    partitions: list[PartitionLagView]
    error: str | None = Field(description="Why the broker did not say.")

    @classmethod
    def measured(cls, group: str, partitions: Sequence[PartitionLagView]) -> ConsumerLag:
        total = sum(lag.lag for lag in partitions)
        return cls(group=group, total=total, partitions=list(partitions), error=None)

    @classmethod
    def unknown(cls, group: str, error: str) -> ConsumerLag:
        return cls(group=group, total=None, partitions=[], error=error)


class OutboxWriterView(ApiModel):
    """A session whose transaction took an outbox id and has not ended (null figures: not visible to the
    admin API's database role; see the runbook)."""

    pid: int | None
    application_name: str | None
    transaction_seconds: float | None
    prepared_gid: str | None = Field(
        default=None,
        description="A prepared transaction (two-phase commit) holding publishing: its gid (it has no pid; "
        "its seconds are since it was prepared)",
    )

    @classmethod
    def of(cls, holder: OutboxHolder) -> OutboxWriterView:
        return cls(
            pid=holder.pid,
            application_name=holder.application_name,
            transaction_seconds=holder.transaction_s,
            prepared_gid=holder.prepared_gid,
        )


class HealthSummary(ApiModel):
    """The gauges `/metrics` serves, read the same way at the same moment, plus what only a worker's
    `/metrics` carries (consumer lag, dead letters), read from the broker and the database."""

    outbox_backlog: int = Field(description="`identity_outbox_backlog`")
    outbox_oldest_age_seconds: float = Field(description="`identity_outbox_oldest_age_seconds`")
    outbox_publishing_held_seconds: float = Field(
        description="`identity_outbox_publishing_held_seconds`: how long the oldest running transaction that "
        "took an outbox id has run (nothing after its id is published until it ends)"
    )
    outbox_held_by: OutboxWriterView | None = Field(
        description="That transaction's session (null when no transaction holds an outbox id)"
    )
    fanout_backlog: int = Field(description="`identity_access_fanout_queue_backlog`")
    fanout_failed: int = Field(description="`identity_access_fanout_failed_tasks`")
    import_running: bool = Field(description="`identity_import_running`: a run is Running")
    dead_letters: int = Field(description="Rows of identity.outbox_dead_letters")
    newest_dead_letter_at: datetime | None
    consumer_lag: ConsumerLag = Field(description="The talent-sync group on Talent's topics")
    read_at: datetime

    @classmethod
    def of(
        cls, queues: QueueGauges, dead: DeadLetters, consumer_lag: ConsumerLag, read_at: datetime
    ) -> HealthSummary:
        held_by = queues.outbox_held_by
        return cls(
            outbox_backlog=queues.outbox_backlog,
            outbox_oldest_age_seconds=queues.outbox_oldest_age_s,
            outbox_publishing_held_seconds=queues.outbox_held_s,
            outbox_held_by=OutboxWriterView.of(held_by) if held_by else None,
            fanout_backlog=queues.fanout_backlog,
            fanout_failed=queues.fanout_failed,
            import_running=queues.import_started_at is not None,
            dead_letters=dead.count,
            newest_dead_letter_at=dead.newest_failed_at,
            consumer_lag=consumer_lag,
            read_at=read_at,
        )


# ---------------------------------------------------------------- one user's access (`access show`)


class AccessAssignment(ApiModel):
    """An Active assignment as UserAccessChanged's activeAssignments carries it (CONTRACTS section 4), its
    values in the event's own text."""

    assignment_id: str
    role_id: str
    role_code: str
    scope_type: str
    scope_organization_id: str | None
    scope_project_group_id: str | None
    scope_project_id: str | None
    expires_at: str | None


# Fields the record's value did not carry readably are None; an unreadable `active_assignments` matches no
# truth.
class AccessEventOnTopic(ApiModel):
    """The user's last record on pin.identity.access.v1, as far as its value could be read."""

    partition: int
    offset: int
    event_id: str | None
    version: int | None
    change_reason: str | None
    changed_role_id: str | None
    occurred_at: datetime | None
    active_assignments: Any = Field(description="The event's activeAssignments as it was sent.")


@dataclass(frozen=True)
class AccessLogSearch:
    """Where the user's key goes on the access topic (None: the topic does not exist), how much of that
    partition was read from its end, and the user's last event there (None: not one since its beginning)."""

    partition: int | None
    records_read: int
    last_event: AccessEventOnTopic | None


# A UserAccessChanged of the user still in the outbox, or refused by the broker for good (`error`).
class QueuedAccessEventView(ApiModel):
    outbox_id: int
    event_id: UUID
    change_reason: str | None
    version: int | None
    queued_at: datetime
    error: str | None = Field(description="A dead letter's: why the broker refused it for good.")


@dataclass(frozen=True)
class UserAccessState:
    """The database's side, read in one snapshot."""

    user_id: UUID
    company_id: UUID | None
    active_assignments: list[dict[str, Any]]  # rendered as the event's activeAssignments
    waiting: tuple[QueuedAccessEventView, ...]  # in the outbox, oldest first
    dead_letters: tuple[QueuedAccessEventView, ...]


class UserAccessReport(ApiModel):
    """`GET /admin/v1/access/users/{userId}`, `access show --json`."""

    user_id: UUID
    company_id: UUID | None
    verdict: Verdict = Field(
        description="`matching`: the last event carries the Active assignments; `pending`: an access event "
        "of the user waits in the outbox; `drifted`: the last event carries other assignments; `missing`: "
        "Active assignments and no event."
    )
    active_assignments: list[AccessAssignment] = Field(
        description="The user's Active assignments now, rendered as the event renders them."
    )
    last_event: AccessEventOnTopic | None
    partition: int | None = Field(
        description="The partition the user's key goes to (null: the topic does not exist)."
    )
    records_read: int = Field(description="Records read from that partition's end to find the last event.")
    difference: AssignmentDifferenceView
    outbox: list[QueuedAccessEventView] = Field(description="The user's access events not yet published.")
    dead_letters: list[QueuedAccessEventView] = Field(
        description="The user's access events the broker refused for good (outbox_dead_letters)."
    )

    @classmethod
    def of(
        cls,
        state: UserAccessState,
        search: AccessLogSearch,
        verdict: Verdict,
        difference: AssignmentDifferenceView,
    ) -> UserAccessReport:
        return cls(
            user_id=state.user_id,
            company_id=state.company_id,
            verdict=verdict,
            active_assignments=[AccessAssignment.model_validate(a) for a in state.active_assignments],
            last_event=search.last_event,
            partition=search.partition,
            records_read=search.records_read,
            difference=difference,
            outbox=list(state.waiting),
            dead_letters=list(state.dead_letters),
        )

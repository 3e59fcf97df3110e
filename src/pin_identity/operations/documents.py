"""The documents the use cases assemble for operators: how an import run ended or stands, quarantined items
applied again, how a role's users are told of its change, the health the console shows, and one user's
access (`access show`). Each is an ApiModel: the HTTP API answers it and the CLI prints it with `--json`, in
one shape.

What a store answers as it is (a role with its size, a quarantined item, a fan-out task, a consumer group's
lag on one partition...) is a document too, defined beside the port that returns it
(pin_identity.operations.ports); the documents here nest some of those. The plain values the stores hand over
only to be summed up (dead letters, one user's database state) also live beside their ports, and a document
built from them is built by the use case that reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
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
)
from pin_identity.domain.talent import ImportStage
from pin_identity.operations.ports.access_reads import AccessEventOnTopic, QueuedAccessEventView
from pin_identity.operations.ports.health_sources import PartitionLagView
from pin_identity.operations.ports.import_records import StageCounts

# ---------------------------------------------------------------- talent import


class ImportRunOutcome(ApiModel):
    """What every document of a run starts with, TalentInitialImportResult's fields: the run, how it ended or
    stands, its counters and how long it took. The base of ImportResult and ImportRunReport, never a document
    of its own (the report is no result: it adds the run's progress)."""

    run_id: UUID
    mode: ImportMode
    status: RunStatus
    dry_run: bool
    companies: StageCounts
    users: StageCounts
    duration_ms: int


class ImportResult(ImportRunOutcome):
    """TalentInitialImportResult (CONTRACTS section 2): how a run ended, or stands."""

    @classmethod
    def of(cls, run: ImportRun, now: datetime) -> ImportResult:
        return cls(**_outcome_fields(run, now))


def _outcome_fields(run: ImportRun, now: datetime) -> dict[str, Any]:
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


class ImportRunReport(ImportRunOutcome):
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
            **_outcome_fields(run, now),
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


# set-role-permissions' answer: how the role's users are told.
class PermissionsChanged(ApiModel):
    role_id: UUID
    role_version: int
    path: FanOutPath = Field(description="`inline`: events written now; `queued`: a fan-out task.")
    users_notified_inline: int
    task_id: UUID | None = Field(description="The enqueued fan-out task (path `queued`).")


# ---------------------------------------------------------------- health: the console's summary


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


# Its OpenAPI schema keeps the name clients know, OutboxWriterView.
class PublishingHolderView(ApiModel, schema_name="OutboxWriterView"):
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


class HealthSummary(ApiModel):
    """The gauges `/metrics` serves, read the same way at the same moment, plus what only a worker's
    `/metrics` carries (consumer lag, dead letters), read from the broker and the database."""

    outbox_backlog: int = Field(description="`identity_outbox_backlog`")
    outbox_oldest_age_seconds: float = Field(description="`identity_outbox_oldest_age_seconds`")
    outbox_publishing_held_seconds: float = Field(
        description="`identity_outbox_publishing_held_seconds`: how long the oldest running transaction that "
        "took an outbox id has run (nothing after its id is published until it ends)"
    )
    outbox_held_by: PublishingHolderView | None = Field(
        description="That transaction's session (null when no transaction holds an outbox id)"
    )
    fanout_backlog: int = Field(description="`identity_access_fanout_queue_backlog`")
    fanout_failed: int = Field(description="`identity_access_fanout_failed_tasks`")
    import_running: bool = Field(description="`identity_import_running`: a run is Running")
    dead_letters: int = Field(description="Rows of identity.outbox_dead_letters")
    newest_dead_letter_at: datetime | None
    consumer_lag: ConsumerLag = Field(description="The talent-sync group on Talent's topics")
    read_at: datetime


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

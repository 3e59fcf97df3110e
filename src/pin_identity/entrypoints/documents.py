"""Every JSON document of the operator surfaces, in the contract's camelCase (CONTRACTS sections 2 and 6):
what operators read and what their actions answer (the HTTP API answers them and the CLI prints them with
`--json`, so both speak one shape), the admin API's request bodies, its problem answers and its probes'
answers. Each answer is built from the operator service's read model; timestamps are ISO-8601. Python code
names fields in snake_case; JSON carries the camelCase aliases."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from http import HTTPStatus
from typing import Annotated, Any, Literal, Self
from uuid import UUID

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

from pin_identity.domain.access_audit import Verdict
from pin_identity.domain.fanout import FanOutPath
from pin_identity.domain.model import FanOutTaskStatus, RoleStatus
from pin_identity.domain.talent import ImportStage
from pin_identity.domain.talent_import import (
    MAX_PAGE_SIZE,
    ImportMode,
    ImportRequest,
    PageStatus,
    RunStatus,
)
from pin_identity.operations.read_models import (
    HealthReport,
    ImportRunView,
    UserAccess,
)


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    @classmethod
    def of(cls, view: Any) -> Self:
        """The document of a read model whose attributes carry its fields by name (nested ones too); a
        document whose read model says things otherwise builds itself in its own `of`."""
        return cls.model_validate(view, from_attributes=True)


# ---------------------------------------------------------------- talent import


class StageCounts(ApiModel):
    planned: int
    applied: int
    skipped: int
    failed: int


class ImportRunReport(ApiModel):
    """TalentInitialImportResult plus progress: `GET .../runs/{runId}` and `talent-import status --json`."""

    run_id: UUID
    mode: ImportMode
    status: RunStatus
    dry_run: bool
    companies: StageCounts
    users: StageCounts
    duration_ms: int
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

    @classmethod
    def of(cls, view: ImportRunView) -> ImportRunReport:
        run = view.run
        return cls(
            run_id=run.run_id,
            mode=run.mode,
            status=run.status,
            dry_run=run.dry_run,
            companies=StageCounts.of(run.companies),
            users=StageCounts.of(run.users),
            duration_ms=view.duration_ms,
            started_at=run.started_at,
            finished_at=run.finished_at,
            planning=run.planning_stage,
            pages={
                stage.value: {status.value: view.pages(stage, status) for status in PageStatus}
                for stage in ImportStage
            },
            eta_seconds=view.eta_seconds,
            lock_holder=view.lock_holder,
            error_code=run.error_code,
            error=run.error,
        )


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


class ReplayResult(ApiModel):
    applied: int
    skipped: int
    failed: int


class ImportRunSummary(ApiModel):
    """A run in the list: its counters; `GET .../runs/{runId}` adds pages, ETA and the lock holder."""

    run_id: UUID
    mode: ImportMode
    status: RunStatus
    dry_run: bool
    # The read model calls it by the domain's name.
    talent_tenant_id_filter: UUID | None = Field(
        validation_alias=AliasChoices("tenant_filter", "talent_tenant_id_filter", "talentTenantIdFilter")
    )
    page_size: int
    companies: StageCounts
    users: StageCounts
    started_at: datetime
    finished_at: datetime | None
    error_code: str | None
    quarantined: int = Field(description="Items of this run in the quarantine now.")


class StartImportRun(ApiModel):
    mode: Literal["ApiPull", "TopicReplay", "api-pull", "topic-replay"]
    talent_tenant_id_filter: UUID | None = Field(
        default=None, description="Only this Talent tenant and its users."
    )
    page_size: int = Field(default=500, ge=1, le=MAX_PAGE_SIZE, description="Items per page.")
    # Both flags are strict: only a JSON boolean, so `0`, `1` or `"yes"` is bad input rather than a guess.
    dry_run: bool = Field(default=False, strict=True, description="Count only: no replica row, no event.")
    correlation_id: UUID | None = None
    force: bool = Field(
        default=False,
        strict=True,
        description="Run even if the source lists far fewer companies than the replica holds "
        "(the CLI's `--force`; without it such a source is refused: `IDENTITY_IMPORT_SOURCE_INCOMPLETE`).",
    )

    def to_request(self) -> ImportRequest:
        return ImportRequest(
            ImportMode.parse(self.mode),
            self.talent_tenant_id_filter,
            self.page_size,
            self.dry_run,
            self.correlation_id,
            self.force,
        )


class RunAccepted(ApiModel):
    run_id: UUID


class RunCancelled(ApiModel):
    run_id: UUID
    status: RunStatus


class LeasesReset(ApiModel):
    run_id: UUID
    pages: int = Field(description="InProgress pages made claimable now.")


class ReplayRequest(ApiModel):
    """Which quarantined items to apply again; all of them when `itemIds` is left out."""

    item_ids: list[UUID] | None = None


# ---------------------------------------------------------------- access fan-out and roles


class FanOutTask(ApiModel):
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


class PermissionsChanged(ApiModel):
    role_id: UUID
    role_version: int
    path: FanOutPath = Field(description="`inline`: events written now; `queued`: a fan-out task.")
    users_notified_inline: int
    task_id: UUID | None = Field(description="The enqueued fan-out task (path `queued`).")


class TaskReplayed(ApiModel):
    task_id: UUID
    status: FanOutTaskStatus


class TaskDiscarded(ApiModel):
    """A Failed fan-out task deleted by an operator: what it was."""

    task_id: UUID
    role_id: UUID
    role_version: int
    processed_count: int = Field(description="Users notified before it failed; those after were not by it.")


# No control characters (PostgreSQL text refuses NUL) and short enough for the primary key's index.
PermissionCode = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
]


class SetRolePermissions(ApiModel):
    permissions: list[PermissionCode] = Field(
        max_length=1000, description="The complete new permission set (may be empty)."
    )


# ---------------------------------------------------------------- one user's access


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


class QueuedAccessEventView(ApiModel):
    outbox_id: int
    event_id: UUID
    change_reason: str | None
    version: int | None
    queued_at: datetime
    error: str | None = Field(description="A dead letter's: why the broker refused it for good.")


class AssignmentDifferenceView(ApiModel):
    only_in_database: list[str] = Field(description="Active now, not in the last event: consumers lack it.")
    only_on_topic: list[str] = Field(
        description="In the last event, not Active now: consumers still grant it."
    )
    changed: list[str] = Field(description="In both, with other fields (role code, scope, expiry).")


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
    def of(cls, access: UserAccess) -> UserAccessReport:
        state, search, last = access.state, access.search, access.search.last_event
        return cls(
            user_id=state.user_id,
            company_id=state.company_id,
            verdict=access.verdict,
            active_assignments=[AccessAssignment.model_validate(a) for a in state.active_assignments],
            last_event=AccessEventOnTopic.of(last) if last is not None else None,
            partition=search.partition,
            records_read=search.records_read,
            difference=AssignmentDifferenceView.model_validate(access.difference, from_attributes=True),
            outbox=[QueuedAccessEventView.of(event) for event in state.waiting],
            dead_letters=[QueuedAccessEventView.of(event) for event in state.dead_letters],
        )


# ---------------------------------------------------------------- retention


class PruneResult(ApiModel):
    fanout_tasks: int = Field(
        description="Completed fan-out tasks deleted (a Failed one stays until replayed or discarded)."
    )
    import_runs: int = Field(description="Finished import runs deleted, with their pages and quarantine.")
    quarantine_payloads: int = Field(description="Quarantined snapshots (PII) emptied.")


# ---------------------------------------------------------------- operators

READ_METHODS = frozenset({"GET", "HEAD"})


class AdminRole(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"

    def permits(self, method: str) -> bool:
        """A viewer reads (every GET); an operator also acts (every route)."""
        return self is AdminRole.OPERATOR or method.upper() in READ_METHODS


class SignedInOperator(ApiModel):
    name: str = Field(description="As the tokens file names them; `admin` for PIN_IDENTITY_ADMIN_TOKEN.")
    role: AdminRole = Field(description="`viewer`: every GET; `operator`: every route.")


# ---------------------------------------------------------------- health


class PartitionLagView(ApiModel):
    topic: str
    partition: int
    lag: int
    committed_offset: int | None = Field(
        validation_alias=AliasChoices("committed", "committed_offset", "committedOffset"),
        description="Null when the group has committed nothing there.",
    )


class ConsumerLag(ApiModel):
    group: str
    total: int | None = Field(
        description="Records behind on Talent's topics; null when the broker did not say."
    )
    partitions: list[PartitionLagView]
    error: str | None = Field(description="Why the broker did not say.")


class OutboxWriterView(ApiModel):
    """A session whose transaction took an outbox id and has not ended (null figures: not visible to the
    admin API's database role; see the runbook)."""

    pid: int | None
    application_name: str | None
    transaction_seconds: float | None = Field(
        validation_alias=AliasChoices("transaction_s", "transaction_seconds", "transactionSeconds")
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
    def of(cls, health: HealthReport) -> HealthSummary:
        queues, dead = health.queues, health.dead_letters
        return cls(
            outbox_backlog=queues.outbox_backlog,
            outbox_oldest_age_seconds=queues.outbox_oldest_age_s,
            outbox_publishing_held_seconds=queues.outbox_held_s,
            outbox_held_by=OutboxWriterView.of(queues.outbox_held_by) if queues.outbox_held_by else None,
            fanout_backlog=queues.fanout_backlog,
            fanout_failed=queues.fanout_failed,
            import_running=queues.import_started_at is not None,
            dead_letters=dead.count,
            newest_dead_letter_at=dead.newest_failed_at,
            consumer_lag=ConsumerLag.of(health.consumer_lag),
            read_at=health.read_at,
        )


# ---------------------------------------------------------------- probes and problems (the admin API's own)


class Health(ApiModel):
    status: Literal["ok", "ready"]


class Readiness(ApiModel):
    """`/readyz` of `serve` and of a worker: ready, and what is wrong without making the process unready."""

    status: Literal["ready"]
    warnings: list[str] = Field(
        description="What is wrong without making the process unready (a tokens file that cannot be used)."
    )


class ValidationIssue(ApiModel):
    location: str = Field(description="Where in the request: `body.pageSize`, `path.runId`, `query.status`.")
    message: str


class Problem(ApiModel):
    """RFC 9457 problem details (`application/problem+json`) with the stable error `code`."""

    type: str = Field(description="A URI naming the problem type: `urn:pin-identity:problem:<code>`.")
    title: str = Field(description="The HTTP status phrase.")
    status: int
    detail: str
    code: str = Field(description="Stable error code, e.g. `IDENTITY_IMPORT_ALREADY_RUNNING`.")
    instance: str | None = Field(default=None, description="The request path.")
    errors: list[ValidationIssue] | None = Field(
        default=None, description="Request validation errors (code `IDENTITY_INVALID_REQUEST` only)."
    )

    @classmethod
    def answering(
        cls, status: int, code: str, detail: str, instance: str, errors: list[ValidationIssue] | None = None
    ) -> Problem:
        return cls(
            type=f"urn:pin-identity:problem:{code}",
            title=HTTPStatus(status).phrase,
            status=status,
            detail=detail,
            code=code,
            instance=instance,
            errors=errors,
        )

"""The JSON documents of what operators read and what their actions answer, in the contract's camelCase
(CONTRACTS sections 2 and 6): the HTTP API answers them and the CLI prints them with `--json`, so both speak
one shape. Each is built from the operator service's read model; timestamps are ISO-8601.
Python code names fields in snake_case; JSON carries the camelCase aliases."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from pin_identity.domain.access_audit import Verdict
from pin_identity.domain.fanout import FanOutPath
from pin_identity.domain.model import FanOutTaskStatus, RoleStatus
from pin_identity.domain.talent import ImportStage
from pin_identity.domain.talent_import import ImportMode, PageStatus, RunStatus, StageCounters
from pin_identity.operations.identity import PermissionsChange
from pin_identity.operations.read_models import (
    FailedItemView,
    FanOutTaskView,
    ImportRunView,
    LastAccessEvent,
    Pruned,
    QueuedAccessEvent,
    Replayed,
    RoleSummary,
    UserAccess,
)


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


# ---------------------------------------------------------------- talent import


class StageCounts(ApiModel):
    planned: int
    applied: int
    skipped: int
    failed: int

    @classmethod
    def of(cls, counters: StageCounters) -> StageCounts:
        return cls(
            planned=counters.planned,
            applied=counters.applied,
            skipped=counters.skipped,
            failed=counters.failed,
        )


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

    @classmethod
    def of(cls, view: FailedItemView) -> FailedItem:
        return cls(
            item_id=view.item_id,
            stage=view.stage,
            external_id=view.external_id,
            error_code=view.error_code,
            reason=view.reason,
            attempts=view.attempts,
            created_at=view.created_at,
            updated_at=view.updated_at,
        )


class ReplayResult(ApiModel):
    applied: int
    skipped: int
    failed: int

    @classmethod
    def of(cls, replayed: Replayed) -> ReplayResult:
        return cls(applied=replayed.applied, skipped=replayed.skipped, failed=replayed.failed)


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

    @classmethod
    def of(cls, view: FanOutTaskView) -> FanOutTask:
        return cls.model_validate(view, from_attributes=True)


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

    @classmethod
    def of(cls, role: RoleSummary) -> RoleView:
        return cls(
            role_id=role.role_id,
            code=role.code,
            name=role.name,
            company_id=role.company_id,
            company_name=role.company_name,
            status=role.status,
            version=role.version,
            permissions=list(role.permissions),
            holders=role.holders,
        )


class PermissionsChanged(ApiModel):
    role_id: UUID
    role_version: int
    path: FanOutPath = Field(description="`inline`: events written now; `queued`: a fan-out task.")
    users_notified_inline: int
    task_id: UUID | None = Field(description="The enqueued fan-out task (path `queued`).")

    @classmethod
    def of(cls, change: PermissionsChange) -> PermissionsChanged:
        return cls.model_validate(change, from_attributes=True)


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

    @classmethod
    def of(cls, event: LastAccessEvent) -> AccessEventOnTopic:
        return cls.model_validate(event, from_attributes=True)


class QueuedAccessEventView(ApiModel):
    outbox_id: int
    event_id: UUID
    change_reason: str | None
    version: int | None
    queued_at: datetime
    error: str | None = Field(description="A dead letter's: why the broker refused it for good.")

    @classmethod
    def of(cls, event: QueuedAccessEvent) -> QueuedAccessEventView:
        return cls.model_validate(event, from_attributes=True)


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
    fanout_tasks: int = Field(description="Completed or Failed fan-out tasks deleted.")
    import_runs: int = Field(description="Finished import runs deleted, with their pages and quarantine.")
    quarantine_payloads: int = Field(description="Quarantined snapshots (PII) emptied.")

    @classmethod
    def of(cls, pruned: Pruned) -> PruneResult:
        return cls.model_validate(pruned, from_attributes=True)

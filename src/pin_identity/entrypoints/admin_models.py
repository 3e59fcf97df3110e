"""Request and response bodies of the platform-admin HTTP API (CONTRACTS section 6), in the contract's
camelCase. Python code builds them by their snake_case field names; JSON carries the camelCase aliases."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

from pin_identity.domain.fanout import FanOutPath
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.domain.talent import ImportStage
from pin_identity.domain.talent_import import (
    MAX_PAGE_SIZE,
    ImportMode,
    ImportRequest,
    RunStatus,
)


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


# ---------------------------------------------------------------- errors (RFC 9457)


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


# ---------------------------------------------------------------- talent import


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


class StageCounts(ApiModel):
    planned: int
    applied: int
    skipped: int
    failed: int


class ImportRunReport(ApiModel):
    """TalentInitialImportResult plus progress: what `talent-import status --json` prints."""

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


class RunCancelled(ApiModel):
    run_id: UUID
    status: RunStatus


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
    def from_store(cls, row: dict[str, Any]) -> FailedItem:
        return cls.model_validate({**row, "itemId": row["id"]})


# ---------------------------------------------------------------- access fan-out


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
    def from_store(cls, row: dict[str, Any]) -> FanOutTask:
        return cls.model_validate({**row, "task_id": row["id"]})


class ReplayRequest(ApiModel):
    """Which quarantined items to apply again; all of them when `itemIds` is left out."""

    item_ids: list[UUID] | None = None


class ReplayResult(ApiModel):
    applied: int
    skipped: int
    failed: int


class TaskReplayed(ApiModel):
    task_id: UUID
    status: FanOutTaskStatus


# ---------------------------------------------------------------- roles

# No control characters (PostgreSQL text refuses NUL) and short enough for the primary key's index.
PermissionCode = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
]


class SetRolePermissions(ApiModel):
    permissions: list[PermissionCode] = Field(
        max_length=1000, description="The complete new permission set (may be empty)."
    )


class PermissionsChanged(ApiModel):
    role_id: UUID
    role_version: int
    path: FanOutPath = Field(description="`inline`: events written now; `queued`: a fan-out task.")
    users_notified_inline: int
    task_id: UUID | None = Field(description="The enqueued fan-out task (path `queued`).")


# ---------------------------------------------------------------- probes


class Health(ApiModel):
    status: Literal["ok", "ready"]

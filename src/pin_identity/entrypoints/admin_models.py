"""The bodies only the platform-admin HTTP API has (CONTRACTS section 6): requests, problems, the answers
of its actions, in the contract's camelCase. What the CLI prints as well lives in entrypoints.documents."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field, StringConstraints

from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.domain.talent_import import (
    MAX_PAGE_SIZE,
    ImportMode,
    ImportRequest,
    RunStatus,
)

# The documents both the API and the CLI print, importable from here as well.
from pin_identity.entrypoints.documents import ApiModel as ApiModel  # noqa: PLC0414
from pin_identity.entrypoints.documents import ReplayResult as ReplayResult  # noqa: PLC0414
from pin_identity.entrypoints.documents import StageCounts as StageCounts  # noqa: PLC0414

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


class RunCancelled(ApiModel):
    run_id: UUID
    status: RunStatus


class ReplayRequest(ApiModel):
    """Which quarantined items to apply again; all of them when `itemIds` is left out."""

    item_ids: list[UUID] | None = None


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


# ---------------------------------------------------------------- probes


class Health(ApiModel):
    status: Literal["ok", "ready"]


class Readiness(ApiModel):
    status: Literal["ready"]
    warnings: list[str] = Field(
        description="What is wrong without making the process unready (a tokens file that cannot be used)."
    )

"""The JSON documents of the operator surfaces that no use case returns: the admin API's request bodies, the
short answers of its actions, its problem answers and its probes' answers, and what the CLI prints with
`--json` about the process's own setup. Every other document is a use case's, answered and printed as it is:
one the use cases assemble (pin_identity.operations.documents) or one a store returns, beside its port
(pin_identity.operations.ports). All speak the contract's camelCase (CONTRACTS sections 2 and 6); timestamps
are ISO-8601."""

from __future__ import annotations

from enum import StrEnum
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Literal
from uuid import UUID

from pydantic import Field, StringConstraints

from pin_identity.domain.api_model import ApiModel
from pin_identity.domain.import_run import (
    MAX_PAGE_SIZE,
    ImportMode,
    ImportRequest,
    RunStatus,
)
from pin_identity.domain.model import (
    PERMISSION_CODE_MAX_LENGTH,
    PERMISSION_CODE_PATTERN,
    PERMISSIONS_PER_ROLE_MAX,
    FanOutTaskStatus,
)
from pin_identity.operations.fanout_admin import PastCursor, TaskDiscard

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


class LeasesReset(ApiModel):
    run_id: UUID
    pages: int = Field(description="InProgress pages made claimable now.")


class ReplayRequest(ApiModel):
    """Which quarantined items to apply again; all of them when `itemIds` is left out."""

    item_ids: list[UUID] | None = None


# ---------------------------------------------------------------- access fan-out and roles


class TaskReplayed(ApiModel):
    task_id: UUID
    status: FanOutTaskStatus


class TaskDiscarded(ApiModel):
    """A Failed fan-out task deleted by an operator: what it was, and whether the users past its cursor heard
    of their role since."""

    task_id: UUID
    role_id: UUID
    role_version: int
    processed_count: int = Field(description="Users notified before it failed; those after were not by it.")
    users_past_cursor: PastCursor = Field(
        description="told: a newer task of the role completed, or a newer version was announced inline; "
        "being-told: a newer task is Pending or InProgress; never-told: nothing told them since"
    )
    told_by: UUID | None = Field(description="The newer task that told them, or will.")
    detail: str = Field(description="The same, in words, with what to do when they were never told.")

    @classmethod
    def of(cls, discarded: TaskDiscard) -> TaskDiscarded:
        task = discarded.task
        return cls(
            task_id=task.task_id,
            role_id=task.role_id,
            role_version=task.role_version,
            processed_count=task.processed_count,
            users_past_cursor=discarded.past_cursor,
            told_by=discarded.told_by,
            detail=discarded.detail,
        )


# The domain's rule, stated in the schema: pydantic refuses a code before the use case would.
PermissionCode = Annotated[
    str,
    StringConstraints(min_length=1, max_length=PERMISSION_CODE_MAX_LENGTH, pattern=PERMISSION_CODE_PATTERN),
]


class SetRolePermissions(ApiModel):
    permissions: list[PermissionCode] = Field(
        max_length=PERMISSIONS_PER_ROLE_MAX, description="The complete new permission set (may be empty)."
    )


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


# ---------------------------------------------------------------- the process's own setup (CLI only)


class TopicsEnsured(ApiModel):
    """`kafka ensure-topics --json`: the topics created, and those whose largest event was raised to what a
    heavy user's access snapshot needs (`max.message.bytes`)."""

    created: list[str]
    raised: list[str]


class EmbeddedPostgres(ApiModel):
    software: str
    url: str | None = Field(description="Null until the server has been started once under this data dir.")
    running: bool
    pid: int | None
    in_use: bool = Field(description="False when a URL is configured: commands then never touch this server.")
    log_file: Path


class EmbeddedBroker(ApiModel):
    software: str
    bootstrap_servers: str | None = Field(
        description="Null until the broker has been started once under this data dir."
    )
    running: bool
    pid: int | None
    in_use: bool = Field(
        description="False when bootstrap servers are configured: commands then never touch this broker."
    )
    log_file: Path


class EmbeddedInfo(ApiModel):
    """`embedded info --json`."""

    data_dir: Path
    postgres: EmbeddedPostgres
    broker: EmbeddedBroker

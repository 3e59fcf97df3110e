"""The admin API's routes for the operator console (`/ui/`): who is signed in, the list of runs, reset-leases
and the replay of a run's quarantine, the roles with their size, the health summary, and one user's access
(`access show`). Same admission, problem answers and audit lines as the routes of admin_http (CONTRACTS
section 6); the console has no logic of its own beyond these."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import Query, Request
from pydantic import Field

from pin_identity.composition import BrokerUnreachableError
from pin_identity.config import ConfigurationError
from pin_identity.domain.events import now_utc
from pin_identity.domain.talent_import import ImportMode, RunStatus
from pin_identity.entrypoints.admin_models import ReplayRequest
from pin_identity.entrypoints.admin_operators import AdminRole
from pin_identity.entrypoints.admin_problems import ProblemError, problem_responses
from pin_identity.entrypoints.admin_routing import (
    ContainerDep,
    RoleId,
    RunId,
    SignedIn,
    UserId,
    Who,
    admin_router,
)
from pin_identity.entrypoints.documents import ApiModel, ReplayResult, RoleView, StageCounts, UserAccessReport
from pin_identity.observability import metrics
from pin_identity.operations import read_models

# ---------------------------------------------------------------- bodies


class SignedInOperator(ApiModel):
    name: str = Field(description="As the tokens file names them; `admin` for PIN_IDENTITY_ADMIN_TOKEN.")
    role: AdminRole = Field(description="`viewer`: every GET; `operator`: every route.")


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

    @classmethod
    def of(cls, run: read_models.RunSummary) -> ImportRunSummary:
        return cls(
            run_id=run.run_id,
            mode=run.mode,
            status=run.status,
            dry_run=run.dry_run,
            talent_tenant_id_filter=run.tenant_filter,
            page_size=run.page_size,
            companies=StageCounts.of(run.companies),
            users=StageCounts.of(run.users),
            started_at=run.started_at,
            finished_at=run.finished_at,
            error_code=run.error_code,
            quarantined=run.quarantined,
        )


class LeasesReset(ApiModel):
    run_id: UUID
    pages: int = Field(description="InProgress pages made claimable now.")


class PartitionLagView(ApiModel):
    topic: str
    partition: int
    lag: int
    committed_offset: int | None = Field(description="Null when the group has committed nothing there.")

    @classmethod
    def of(cls, lag: read_models.PartitionLag) -> PartitionLagView:
        return cls(topic=lag.topic, partition=lag.partition, lag=lag.lag, committed_offset=lag.committed)


class ConsumerLag(ApiModel):
    group: str
    total: int | None = Field(
        description="Records behind on Talent's topics; null when the broker did not say."
    )
    partitions: list[PartitionLagView]
    error: str | None = Field(description="Why the broker did not say.")

    @classmethod
    def of(cls, lag: read_models.ConsumerLag) -> ConsumerLag:
        partitions = [PartitionLagView.of(partition) for partition in lag.partitions]
        return cls(group=lag.group, total=lag.total, partitions=partitions, error=lag.error)


class OutboxWriterView(ApiModel):
    """A session whose transaction took an outbox id and has not ended (null figures: not visible to the
    admin API's database role; see the runbook)."""

    pid: int | None
    application_name: str | None
    transaction_seconds: float | None


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


# ---------------------------------------------------------------- the signed-in operator

operators = admin_router("/admin/v1", "operators")


@operators.get("/whoami", response_model=SignedInOperator)
def whoami(operator: SignedIn) -> SignedInOperator:
    """The operator this token belongs to and their role: the console shows it, and offers a viewer no
    actions (the server still refuses them: 403 `IDENTITY_ADMIN_FORBIDDEN`)."""
    return SignedInOperator(name=operator.name, role=operator.role)


# ---------------------------------------------------------------- talent import runs

runs = admin_router("/admin/v1/talent-import", "talent-import")


@runs.get("/runs", response_model=list[ImportRunSummary])
def list_import_runs(
    container: ContainerDep, limit: Annotated[int, Query(ge=1, le=500)] = 20
) -> list[ImportRunSummary]:
    """The newest runs first."""
    return [ImportRunSummary.of(run) for run in container.imports.recent_runs(limit)]


@runs.post("/runs/{runId}/reset-leases", response_model=LeasesReset, responses=problem_responses(404))
def reset_import_leases(run_id: RunId, container: ContainerDep, who: Who) -> LeasesReset:
    """The runbook's "stuck" case (`talent-import reset-leases`): every InProgress page of the run becomes
    claimable now, its holder taken for dead."""
    return LeasesReset(run_id=run_id, pages=container.imports.reset_leases(run_id, who=who))


@runs.post(
    "/runs/{runId}/failed-items/replay", response_model=ReplayResult, responses=problem_responses(404, 422)
)
def replay_run_failed_items(
    run_id: RunId, request: ReplayRequest, container: ContainerDep, who: Who
) -> ReplayResult:
    """Apply a run's quarantined items again after fixing their cause (all, or `itemIds`); those that apply
    leave the quarantine (`talent-import replay-failed`)."""
    return ReplayResult.of(container.imports.replay_failed(run_id, request.item_ids, who=who))


# ---------------------------------------------------------------- roles

roles = admin_router("/admin/v1/roles", "roles")


@roles.get("", response_model=list[RoleView])
def list_roles(
    container: ContainerDep,
    code: Annotated[
        str | None,
        # No control characters: PostgreSQL text refuses NUL, and no code holds one.
        Query(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$", description="Only this code."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[RoleView]:
    """Roles with their permissions and size: system roles first, then by company and code."""
    return [RoleView.of(role) for role in container.role_admin.roles(code=code, limit=limit)]


@roles.get("/{roleId}", response_model=RoleView, responses=problem_responses(404))
def get_role(role_id: RoleId, container: ContainerDep) -> RoleView:
    """One role with its permissions and size."""
    return RoleView.of(container.role_admin.role(role_id))


# ---------------------------------------------------------------- health

health = admin_router("/admin/v1/health", "health")


def _gauge(name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


@health.get("/summary", response_model=HealthSummary, responses=problem_responses(503))
def health_summary(request: Request, container: ContainerDep) -> HealthSummary:
    """Outbox backlog and oldest age, fan-out backlog and failed tasks, whether an import runs (the database
    gauges of `/metrics`, refreshed now), dead letters, and the talent-sync consumer's lag."""
    if not request.app.state.gauges.refresh():  # stale figures must not pass for the present
        raise ProblemError(503, "IDENTITY_DATABASE_UNAVAILABLE", "the database is unavailable; try again")
    dead = container.health.dead_letters()
    writer = request.app.state.gauges.outbox.held_by
    fields: dict[str, Any] = {
        "outbox_backlog": int(_gauge("identity_outbox_backlog")),
        "outbox_oldest_age_seconds": _gauge("identity_outbox_oldest_age_seconds"),
        "outbox_publishing_held_seconds": _gauge("identity_outbox_publishing_held_seconds"),
        "outbox_held_by": None
        if writer is None
        else OutboxWriterView(
            pid=writer.pid, application_name=writer.application_name, transaction_seconds=writer.transaction_s
        ),
        "fanout_backlog": int(_gauge("identity_access_fanout_queue_backlog")),
        "fanout_failed": int(_gauge("identity_access_fanout_failed_tasks")),
        "import_running": _gauge("identity_import_running") > 0,
    }
    return HealthSummary(
        **fields,
        dead_letters=dead.count,
        newest_dead_letter_at=dead.newest_failed_at,
        consumer_lag=ConsumerLag.of(container.health.consumer_lag()),
        read_at=now_utc(),
    )


# ---------------------------------------------------------------- one user's access

access = admin_router("/admin/v1/access", "access")


@access.get("/users/{userId}", response_model=UserAccessReport, responses=problem_responses(404, 503))
def show_user_access(user_id: UserId, container: ContainerDep) -> UserAccessReport:
    """`access show`: the user's Active assignments beside their last UserAccessChanged on
    pin.identity.access.v1 (read from the end of the partition the user's key goes to), the user's access
    events still in the outbox or dead-lettered, and the verdict (`matching`, `pending`, `drifted`,
    `missing`); 200 whatever the verdict. 503 `IDENTITY_BROKER_UNAVAILABLE` when the broker does not answer
    within 5 s; 503 `IDENTITY_MISCONFIGURED` when PIN_IDENTITY_KAFKA_CONFIG sets a partitioner whose
    placement cannot be computed (`random`)."""
    try:
        return UserAccessReport.of(container.access_show(user_id))
    except BrokerUnreachableError as exc:
        raise ProblemError(503, "IDENTITY_BROKER_UNAVAILABLE", str(exc)) from None
    except ConfigurationError as exc:
        raise ProblemError(503, "IDENTITY_MISCONFIGURED", str(exc)) from None


routers = (operators, runs, roles, health, access)

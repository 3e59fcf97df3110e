"""The admin API's routes for the operator console (`/ui/`): the list of runs, reset-leases and the replay
of a run's quarantine, the roles with their size, and the health summary. Same admission, problem answers
and audit lines as the routes of admin_http (CONTRACTS section 6); the console has no logic of its own
beyond these."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.security import HTTPBearer
from pydantic import Field

from pin_identity.adapters.kafka.group_lag import GroupLagUnavailableError, PartitionLag, consumer_group_lag
from pin_identity.adapters.postgres.admin_reads import PostgresAdminReads
from pin_identity.composition import Container
from pin_identity.config import ConfigurationError
from pin_identity.domain.events import now_utc
from pin_identity.domain.model import RoleStatus
from pin_identity.domain.talent_import import ImportMode, RunStatus
from pin_identity.entrypoints.admin_models import ReplayRequest
from pin_identity.entrypoints.admin_problems import ProblemError, ProblemRoute, problem_responses
from pin_identity.entrypoints.documents import ApiModel, ReplayResult, StageCounts
from pin_identity.observability import metrics

# ---------------------------------------------------------------- bodies


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


class LeasesReset(ApiModel):
    run_id: UUID
    pages: int = Field(description="InProgress pages made claimable now.")


class RoleView(ApiModel):
    role_id: UUID
    code: str
    name: str
    company_id: UUID | None = Field(description="Null for a system role.")
    company_name: str | None
    status: RoleStatus
    version: int
    permissions: list[str]
    holders: int = Field(description="Users holding an Active assignment of the role: its fan-out size.")


class PartitionLagView(ApiModel):
    topic: str
    partition: int
    lag: int
    committed_offset: int | None = Field(description="Null when the group has committed nothing there.")

    @classmethod
    def of(cls, lag: PartitionLag) -> PartitionLagView:
        return cls(topic=lag.topic, partition=lag.partition, lag=lag.lag, committed_offset=lag.committed)


class ConsumerLag(ApiModel):
    group: str
    total: int | None = Field(
        description="Records behind on Talent's topics; null when the broker did not say."
    )
    partitions: list[PartitionLagView]
    error: str | None = Field(description="Why the broker did not say.")


class HealthSummary(ApiModel):
    """The gauges `/metrics` serves, read the same way at the same moment, plus what only a worker's
    `/metrics` carries (consumer lag, dead letters), read from the broker and the database."""

    outbox_backlog: int = Field(description="`identity_outbox_backlog`")
    outbox_oldest_age_seconds: float = Field(description="`identity_outbox_oldest_age_seconds`")
    fanout_backlog: int = Field(description="`identity_access_fanout_queue_backlog`")
    fanout_failed: int = Field(description="`identity_access_fanout_failed_tasks`")
    import_running: bool = Field(description="`identity_import_running`: a run is Running")
    dead_letters: int = Field(description="Rows of identity.outbox_dead_letters")
    newest_dead_letter_at: datetime | None
    consumer_lag: ConsumerLag = Field(description="The talent-sync group on Talent's topics")
    read_at: datetime


# ---------------------------------------------------------------- admission and dependencies, as admin_http

_bearer = HTTPBearer(auto_error=False, description="The value of PIN_IDENTITY_ADMIN_TOKEN.")


def _container(request: Request) -> Container:
    container: Container = request.app.state.container
    return container


def _who(request: Request) -> str:
    return f"http:{request.client.host if request.client else 'unknown'}"


ContainerDep = Annotated[Container, Depends(_container)]
Who = Annotated[str, Depends(_who)]
RunId = Annotated[UUID, Path(alias="runId", description="The import run.")]
RoleId = Annotated[UUID, Path(alias="roleId", description="The role.")]


def _router(prefix: str, tag: str) -> APIRouter:
    return APIRouter(
        prefix=prefix,
        tags=[tag],
        dependencies=[Depends(_bearer)],
        responses=problem_responses(401, 413),
        route_class=ProblemRoute,
    )


# ---------------------------------------------------------------- talent import runs

runs = _router("/admin/v1/talent-import", "talent-import")


@runs.get("/runs", response_model=list[ImportRunSummary])
def list_import_runs(
    container: ContainerDep, limit: Annotated[int, Query(ge=1, le=500)] = 20
) -> list[ImportRunSummary]:
    """The newest runs first."""
    rows = PostgresAdminReads(container.database).recent_runs(limit)
    return [ImportRunSummary.model_validate(row) for row in rows]


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

roles = _router("/admin/v1/roles", "roles")


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
    rows = PostgresAdminReads(container.database).roles(code=code, limit=limit)
    return [RoleView.model_validate(row) for row in rows]


@roles.get("/{roleId}", response_model=RoleView, responses=problem_responses(404))
def get_role(role_id: RoleId, container: ContainerDep) -> RoleView:
    """One role with its permissions and size."""
    rows = PostgresAdminReads(container.database).roles(role_id=role_id, limit=1)
    if not rows:
        raise ProblemError(404, "IDENTITY_NOT_FOUND", f"role {role_id} does not exist")
    return RoleView.model_validate(rows[0])


# ---------------------------------------------------------------- health

health = _router("/admin/v1/health", "health")


def _gauge(name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def _consumer_lag(container: Container) -> ConsumerLag:
    settings = container.settings
    topics = (settings.talent_tenants_topic, settings.talent_users_topic)
    group = settings.talent_sync_group
    try:
        lags = consumer_group_lag(container.kafka_client_config, group, topics)
    except (GroupLagUnavailableError, ConfigurationError) as exc:
        return ConsumerLag(group=group, total=None, partitions=[], error=str(exc))
    views = [PartitionLagView.of(lag) for lag in lags]
    return ConsumerLag(group=group, total=sum(view.lag for view in views), partitions=views, error=None)


@health.get("/summary", response_model=HealthSummary)
def health_summary(request: Request, container: ContainerDep) -> HealthSummary:
    """Outbox backlog and oldest age, fan-out backlog and failed tasks, whether an import runs (the database
    gauges of `/metrics`, refreshed now), dead letters, and the talent-sync consumer's lag."""
    request.app.state.gauges.refresh()
    dead = PostgresAdminReads(container.database).dead_letters()
    fields: dict[str, Any] = {
        "outbox_backlog": int(_gauge("identity_outbox_backlog")),
        "outbox_oldest_age_seconds": _gauge("identity_outbox_oldest_age_seconds"),
        "fanout_backlog": int(_gauge("identity_access_fanout_queue_backlog")),
        "fanout_failed": int(_gauge("identity_access_fanout_failed_tasks")),
        "import_running": _gauge("identity_import_running") > 0,
    }
    return HealthSummary(
        **fields,
        dead_letters=dead.count,
        newest_dead_letter_at=dead.newest_failed_at,
        consumer_lag=_consumer_lag(container),
        read_at=now_utc(),
    )


routers = (runs, roles, health)

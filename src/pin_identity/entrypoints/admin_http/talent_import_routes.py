"""`/admin/v1/talent-import`: import runs: start, list, read, cancel, reset-leases, and each run's
quarantine (list and replay)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Response

from pin_identity.domain.import_run import RunStatus
from pin_identity.entrypoints.admin_http.problems import problem_responses
from pin_identity.entrypoints.admin_http.routing import ContainerDep, RunId, Who, admin_router
from pin_identity.entrypoints.documents import (
    LeasesReset,
    ReplayRequest,
    RunAccepted,
    RunCancelled,
    StartImportRun,
)
from pin_identity.operations.documents import ImportRunReport, ReplayResult
from pin_identity.operations.ports.import_records import FailedItem, ImportRunSummary

imports = admin_router("/admin/v1/talent-import", "talent-import")


@imports.post(
    "/runs",
    status_code=202,
    response_model=RunAccepted,
    responses={
        202: {"headers": {"Location": {"description": "The run", "schema": {"type": "string"}}}},
        **problem_responses(409, 422, 503),
    },
)
def start_import_run(
    body: StartImportRun, container: ContainerDep, who: Who, response: Response
) -> RunAccepted:
    """Create an import run (never resumes one: 409 while a run is Running; a source that cannot be opened is
    503 first). A `worker` running the `talent-import` job orchestrates it; follow it at the `Location`
    answered. 503 with
    `IDENTITY_IMPORT_SOURCE_UNAVAILABLE` when the source cannot be read or is not configured for the mode,
    503 with `IDENTITY_IMPORT_SOURCE_INCOMPLETE` when it lists far fewer companies than the replica
    holds (send `force` to override)."""
    run = container.use_cases.imports.start(body.to_request(), who=who)
    response.headers["Location"] = f"{imports.prefix}/runs/{run.run_id}"
    return RunAccepted(run_id=run.run_id)


@imports.get("/runs/{runId}", response_model=ImportRunReport, responses=problem_responses(404))
def get_import_run(run_id: RunId, container: ContainerDep) -> ImportRunReport:
    """The run's counters (TalentInitialImportResult), pages by stage and status, an ETA, the lock holder."""
    return container.use_cases.imports.report(run_id)


@imports.post("/runs/{runId}/cancel", response_model=RunCancelled, responses=problem_responses(404, 409))
def cancel_import_run(run_id: RunId, container: ContainerDep, who: Who) -> RunCancelled:
    """Cancel a Running run at once: pages already claimed finish, Done pages are kept."""
    container.use_cases.imports.cancel(run_id, who=who)
    return RunCancelled(run_id=run_id, status=RunStatus.CANCELLED)


@imports.get("/runs/{runId}/failed-items", response_model=list[FailedItem], responses=problem_responses(404))
def list_failed_items(run_id: RunId, container: ContainerDep) -> list[FailedItem]:
    """The run's quarantine, oldest first (payloads stay in the database: they hold PII)."""
    return container.use_cases.imports.failed_items(run_id)


@imports.get("/runs", response_model=list[ImportRunSummary])
def list_import_runs(
    container: ContainerDep, limit: Annotated[int, Query(ge=1, le=500)] = 20
) -> list[ImportRunSummary]:
    """The newest runs first."""
    return container.use_cases.imports.recent_runs(limit)


@imports.post("/runs/{runId}/reset-leases", response_model=LeasesReset, responses=problem_responses(404))
def reset_import_leases(run_id: RunId, container: ContainerDep, who: Who) -> LeasesReset:
    """The runbook's "stuck" case (`talent-import reset-leases`): every InProgress page of the run becomes
    claimable now, its holder taken for dead."""
    return LeasesReset(run_id=run_id, pages=container.use_cases.imports.reset_leases(run_id, who=who))


@imports.post(
    "/runs/{runId}/failed-items/replay", response_model=ReplayResult, responses=problem_responses(404, 422)
)
def replay_run_failed_items(
    run_id: RunId, request: ReplayRequest, container: ContainerDep, who: Who
) -> ReplayResult:
    """Apply a run's quarantined items again after fixing their cause (all, or `itemIds`); those that apply
    leave the quarantine (`talent-import replay-failed`)."""
    return container.use_cases.imports.replay_failed(run_id, request.item_ids, who=who)

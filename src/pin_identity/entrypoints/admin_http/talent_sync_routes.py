"""`/admin/v1/talent-sync`: the continuous consumer's quarantine (items with no run)."""

from __future__ import annotations

from pin_identity.entrypoints.admin_http.problems import problem_responses
from pin_identity.entrypoints.admin_http.routing import ContainerDep, Who, admin_router
from pin_identity.entrypoints.documents import ReplayRequest
from pin_identity.operations.documents import ReplayResult
from pin_identity.operations.ports.import_records import FailedItem

sync = admin_router("/admin/v1/talent-sync", "talent-sync")


@sync.get("/failed-items", response_model=list[FailedItem])
def list_consumer_failed_items(container: ContainerDep) -> list[FailedItem]:
    """Items the continuous talent-sync consumer quarantined (run_id null), oldest first."""
    return container.use_cases.imports.failed_items(None)


@sync.post("/failed-items/replay", response_model=ReplayResult, responses=problem_responses(404, 422))
def replay_consumer_failed_items(request: ReplayRequest, container: ContainerDep, who: Who) -> ReplayResult:
    """Apply quarantined items again after fixing their cause (all, or `itemIds`); those that apply leave."""
    return container.use_cases.imports.replay_failed(None, request.item_ids, who=who)

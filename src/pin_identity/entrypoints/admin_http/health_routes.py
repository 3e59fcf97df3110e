"""`/admin/v1/health/summary`: the console's health, from the database gauges `/metrics` serves."""

from __future__ import annotations

from fastapi import Request

from pin_identity.entrypoints.admin_http.problems import problem_responses
from pin_identity.entrypoints.admin_http.routing import ContainerDep, admin_router
from pin_identity.operations.documents import HealthSummary

health = admin_router("/admin/v1/health", "health")


@health.get("/summary", response_model=HealthSummary, responses=problem_responses(503))
def health_summary(request: Request, container: ContainerDep) -> HealthSummary:
    """Outbox backlog and oldest age, fan-out backlog and failed tasks, whether an import runs (the database
    gauges of `/metrics`, at most 5 s old), dead letters, and the talent-sync consumer's lag. 503
    `IDENTITY_DATABASE_UNAVAILABLE` when the last read of the gauges failed: stale figures must not pass for
    the present."""
    queues = request.app.state.gauges.read()
    return container.use_cases.health.report(queues, container.clock.now())

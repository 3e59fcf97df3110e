"""`serve`'s `/metrics` (the database gauges read at most every few seconds: gauges), `/healthz` and
`/readyz` (the one readiness check of entrypoints.probes, which a worker's port answers too)."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import State

from pin_identity.entrypoints.admin_http.problems import ProblemError, ProblemRoute, problem_responses
from pin_identity.entrypoints.documents import Health, Readiness
from pin_identity.entrypoints.readiness import NOT_READY, NOT_READY_DETAIL, readiness_reply
from pin_identity.observability import metrics

probes = APIRouter(tags=["probes"], route_class=ProblemRoute)


@probes.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text exposition format"}},
)
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus metrics (no authentication); the database gauges are at most 5 s old."""
    # One scrape at a time, on a thread of its own: a flood of scrapes waits in line on the event loop
    # instead of holding every worker thread the admin routes share.
    state = request.app.state
    return await anyio.to_thread.run_sync(_exposition, state, limiter=state.scrapes)


def _exposition(state: State) -> Response:
    state.gauges.refresh()
    state.operators.problem()  # the tokens file's load error as it is now, with no admin traffic
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@probes.get("/healthz", response_model=Health)
async def liveness() -> Health:
    """The process is alive. Answered on the event loop, not in the worker threads that other routes (a
    flood of scrapes among them) may all hold: a busy process is not a dead one."""
    return Health(status="ok")


@probes.get("/readyz", response_model=Readiness, responses=problem_responses(503))
def readiness(request: Request) -> Readiness:
    """200 when the database answers and the broker is reachable (checked at most every 5 s), else 503.
    `warnings` names what is wrong without making the process unready: a tokens file that cannot be read or
    parsed (the operators of its unchanged lines stay in force, and every replica would otherwise leave the
    Service at once over one typo)."""
    status, document = readiness_reply(request.app.state.readiness, request.url.path)
    if not isinstance(document, Readiness):
        raise ProblemError(status, NOT_READY, NOT_READY_DETAIL)
    return document

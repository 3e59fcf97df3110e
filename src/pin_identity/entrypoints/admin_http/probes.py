"""`serve`'s `/metrics` (the database gauges read at the scrape), `/healthz` and `/readyz` (the one readiness
check of entrypoints.probes, which a worker's port answers too)."""

from __future__ import annotations

from contextlib import suppress

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pin_identity.entrypoints.admin_http.problems import (
    DatabaseUnavailableError,
    ProblemError,
    ProblemRoute,
    problem_responses,
)
from pin_identity.entrypoints.documents import Health, Readiness
from pin_identity.entrypoints.probes import NOT_READY, NOT_READY_DETAIL, readiness_reply
from pin_identity.observability import metrics

probes = APIRouter(tags=["probes"], route_class=ProblemRoute)


@probes.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text exposition format"}},
)
def prometheus_metrics(request: Request) -> Response:
    """Prometheus metrics (no authentication); the database gauges are read now."""
    with suppress(DatabaseUnavailableError):  # the gauges keep their last values (the log says why)
        request.app.state.gauges.read()
    request.app.state.operators.problem()  # the tokens file's load error as it is now, with no admin traffic
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@probes.get("/healthz", response_model=Health)
def liveness() -> Health:
    """The process is alive."""
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

"""`pin-identity serve`: the platform-admin HTTP API of CONTRACTS section 6, with /metrics, /healthz, /readyz.

Every `/admin/` route needs `Authorization: Bearer <token>` of a known operator (admin_operators) whose role
permits the method, checked before the body is read, and takes a body of at most 1 MiB (AdminGate); every
error is RFC 9457 problem+json with a `code` (admin_problems). A route parses, calls the operator service
(operations/), and answers its read model as a document (entrypoints.documents); the service writes the
action's `admin-action` audit line, naming the operator.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import psycopg
import uvicorn
from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import PoolTimeout
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pin_identity import __version__
from pin_identity.composition import Container
from pin_identity.config import ConfigurationError
from pin_identity.domain.errors import SourceNotConfiguredError
from pin_identity.domain.events import now_utc
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.domain.talent_import import ImportErrorCode, RunStatus
from pin_identity.entrypoints import admin_reads
from pin_identity.entrypoints.admin_console import console
from pin_identity.entrypoints.admin_models import (
    Health,
    Readiness,
    ReplayRequest,
    RunAccepted,
    RunCancelled,
    SetRolePermissions,
    StartImportRun,
    TaskReplayed,
)
from pin_identity.entrypoints.admin_operators import AdminRole, Operator, Operators
from pin_identity.entrypoints.admin_problems import (
    PROBLEM_JSON,
    ProblemError,
    ProblemRoute,
    handle_exception,
    problem_response,
    problem_responses,
)
from pin_identity.entrypoints.admin_routing import (
    ContainerDep,
    RoleId,
    RunId,
    TaskId,
    Who,
    admin_router,
    caller,
    client_address,
)
from pin_identity.entrypoints.documents import (
    FailedItem,
    FanOutTask,
    ImportRunReport,
    PermissionsChanged,
    ReplayResult,
)
from pin_identity.entrypoints.probes import ReadinessCache
from pin_identity.observability import metrics
from pin_identity.observability.logging import describe_error, get_logger
from pin_identity.operations.ports.outbox import OutboxBacklog, OutboxBacklogSession

log = get_logger("admin-http")

# ---------------------------------------------------------------- admission: token and size, before the body

# FastAPI reads and parses a request's body before any dependency runs, so a dependency cannot refuse a
# request before its body: an unauthenticated client could make the server wait for, and parse, any body.
MAX_BODY_BYTES = 1024 * 1024
_ADMIN_PATHS = "/admin/"
FORBIDDEN = "IDENTITY_ADMIN_FORBIDDEN"


class _ClientGoneError(Exception):
    """The client hung up before its body was complete: nobody is left to answer."""


def _bearer_token(headers: Headers) -> str:
    """The credentials of `Authorization: Bearer <token>`; "" for any other scheme or none (as HTTPBearer)."""
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


def _announced_size(headers: Headers) -> int | None:
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None  # none announced (chunked): only counting tells


def _announces_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or _announced_size(headers) not in (None, 0)


def _too_large(request: Request) -> ProblemError:
    actor = caller(request)
    log.warning("admin-request-too-large", who=actor.who, client=actor.client, path=request.url.path)
    return ProblemError(413, "IDENTITY_REQUEST_TOO_LARGE", f"the request body exceeds {MAX_BODY_BYTES} bytes")


async def _read_body(request: Request) -> bytes:
    """The whole body, counted while it arrives: refused as soon as it outgrows MAX_BODY_BYTES."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise _ClientGoneError
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large(request)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """The body already read, as one message; then the server's own `receive`, which reports a disconnect."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _refuse(request: Request, refusal: ProblemError, send: Send) -> None:
    response = problem_response(request, refusal)
    if _announces_body(request.headers):
        # The body stays unread: closing the connection spares the server the rest of it.
        response.headers["Connection"] = "close"
    await response(request.scope, request.receive, send)


class AdminGate:
    """Admission to every `/admin/` route before a byte of its body is read: a token of no operator is 401, a
    method the operator's role does not permit 403 (both logged, neither with the token); a body over
    MAX_BODY_BYTES 413, by its Content-Length at once or, chunked, as soon as it has grown that large. An
    admitted request reaches the route with its operator (`request.state.operator`) and its body read."""

    def __init__(self, app: ASGIApp, *, operators: Operators) -> None:
        self._app = app
        self._operators = operators

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_ADMIN_PATHS):
            await self._app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            request.state.operator = self._admit(request)
            _check_announced_size(request)
            body = await _read_body(request)
        except ProblemError as refusal:
            await _refuse(request, refusal, send)
        except _ClientGoneError:
            return
        else:
            await self._app(scope, _replaying(body, receive), send)

    def _admit(self, request: Request) -> Operator:
        operator = self._operators.authenticate(_bearer_token(request.headers))
        where = {"client": client_address(request), "method": request.method, "path": request.url.path}
        if operator is None:
            log.warning("admin-auth-failed", **where)
            raise ProblemError(
                401,
                "IDENTITY_UNAUTHORIZED",
                "a valid bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not operator.role.permits(request.method):
            log.warning("admin-forbidden", who=f"http:{operator.name}", role=operator.role.value, **where)
            raise ProblemError(
                403,
                FORBIDDEN,
                f"operator {operator.name} has the role {operator.role.value}, which may only read; "
                f"{request.method} needs the role operator",
            )
        return operator


def _check_announced_size(request: Request) -> None:
    size = _announced_size(request.headers)
    if size is not None and size > MAX_BODY_BYTES:
        raise _too_large(request)


# ---------------------------------------------------------------- talent import

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
    """Create an import run (never resumes one: 409 while a run is Running). A `worker` running the
    `talent-import` job orchestrates it; follow it at the `Location` answered. 503 with
    `IDENTITY_IMPORT_SOURCE_UNAVAILABLE` when the source cannot be read or is not configured for the mode,
    503 with `IDENTITY_IMPORT_SOURCE_INCOMPLETE` when it lists far fewer companies than the replica
    holds (send `force` to override)."""
    try:
        run = container.imports.start(body.to_request(), who=who)
    except SourceNotConfiguredError as exc:  # e.g. no PIN_IDENTITY_TALENT_API_URL for api-pull
        raise ProblemError(503, ImportErrorCode.SOURCE_UNAVAILABLE.value, str(exc)) from None
    response.headers["Location"] = f"{imports.prefix}/runs/{run.run_id}"
    return RunAccepted(run_id=run.run_id)


@imports.get("/runs/{runId}", response_model=ImportRunReport, responses=problem_responses(404))
def get_import_run(run_id: RunId, container: ContainerDep) -> ImportRunReport:
    """The run's counters (TalentInitialImportResult), pages by stage and status, an ETA, the lock holder."""
    return ImportRunReport.of(container.imports.report(run_id))


@imports.post("/runs/{runId}/cancel", response_model=RunCancelled, responses=problem_responses(404, 409))
def cancel_import_run(run_id: RunId, container: ContainerDep, who: Who) -> RunCancelled:
    """Cancel a Running run at once: pages already claimed finish, Done pages are kept."""
    container.imports.cancel(run_id, who=who)
    return RunCancelled(run_id=run_id, status=RunStatus.CANCELLED)


@imports.get("/runs/{runId}/failed-items", response_model=list[FailedItem], responses=problem_responses(404))
def list_failed_items(run_id: RunId, container: ContainerDep) -> list[FailedItem]:
    """The run's quarantine, oldest first (payloads stay in the database: they hold PII)."""
    return [FailedItem.of(item) for item in container.imports.failed_items(run_id)]


# ---------------------------------------------------------------- access fan-out

fanout = admin_router("/admin/v1/access-fanout", "access-fanout")


@fanout.get("/tasks", response_model=list[FanOutTask])
def list_fanout_tasks(
    container: ContainerDep,
    status: Annotated[FanOutTaskStatus | None, Query(description="Only tasks in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> list[FanOutTask]:
    """The newest fan-out tasks first."""
    return [FanOutTask.of(task) for task in container.fanout_admin.tasks(status, limit)]


@fanout.post("/tasks/{taskId}/replay", response_model=TaskReplayed, responses=problem_responses(404, 409))
def replay_fanout_task(task_id: TaskId, container: ContainerDep, who: Who) -> TaskReplayed:
    """The runbook's replay: a Failed task goes back to Pending with AttemptCount = 0, from its cursor."""
    container.fanout_admin.replay(task_id, who=who)
    return TaskReplayed(task_id=task_id, status=FanOutTaskStatus.PENDING)


# ---------------------------------------------------------------- the continuous consumer's quarantine

sync = admin_router("/admin/v1/talent-sync", "talent-sync")


@sync.get("/failed-items", response_model=list[FailedItem])
def list_consumer_failed_items(container: ContainerDep) -> list[FailedItem]:
    """Items the continuous talent-sync consumer quarantined (run_id null), oldest first."""
    return [FailedItem.of(item) for item in container.imports.failed_items(None)]


@sync.post("/failed-items/replay", response_model=ReplayResult, responses=problem_responses(404, 422))
def replay_consumer_failed_items(request: ReplayRequest, container: ContainerDep, who: Who) -> ReplayResult:
    """Apply quarantined items again after fixing their cause (all, or `itemIds`); those that apply leave."""
    return ReplayResult.of(container.imports.replay_failed(None, request.item_ids, who=who))


# ---------------------------------------------------------------- roles

roles = admin_router("/admin/v1/roles", "roles")


@roles.put(
    "/{roleId}/permissions", response_model=PermissionsChanged, responses=problem_responses(404, 409, 422)
)
def set_role_permissions(
    role_id: RoleId, body: SetRolePermissions, container: ContainerDep, who: Who
) -> PermissionsChanged:
    """set-role-permissions: replace the set, bump the role's version, notify its users inline (role size
    <= PIN_IDENTITY_INLINE_FANOUT_THRESHOLD) or enqueue a fan-out task, in one transaction."""
    return PermissionsChanged.of(container.role_admin.set_permissions(role_id, body.permissions, who=who))


# ---------------------------------------------------------------- metrics and probes


class DatabaseGauges:
    """The gauges read from the database, refreshed at scrape time. The outbox backlog comes from the
    outbox queue's own query, on one dedicated session kept for the process."""

    def __init__(self, container: Container):
        self._container = container
        self._outbox: OutboxBacklogSession | None = None
        self._lock = threading.Lock()
        self.outbox = OutboxBacklog(0, 0.0)  # as the last refresh read it

    def _outbox_backlog(self) -> OutboxBacklog:
        with self._lock:
            if self._outbox is None:
                self._outbox = self._container.outbox_backlog_reader()
            try:
                return self._outbox.backlog()
            except psycopg.Error:
                self._outbox.reset()  # reconnect at the next scrape
                raise

    def refresh(self) -> bool:
        """False when the database did not answer: the gauges keep their last values (a scrape still answers,
        and the log says why)."""
        try:
            outbox = self._outbox_backlog()
            stats = self._container.fanout_queue.stats(now_utc())
            running = self._container.import_store.running_run()
        except (psycopg.Error, PoolTimeout, ConfigurationError) as exc:
            log.warning("metrics-refresh-failed", error=describe_error(exc))
            return False
        self.outbox = outbox
        metrics.record_outbox_backlog(outbox.waiting, outbox.oldest_age_s, outbox.held_s)
        metrics.record_fanout_queue(stats.backlog, stats.failed)
        metrics.record_import_running(running.started_at if running else None)
        return True

    def close(self) -> None:
        with self._lock:
            if self._outbox is not None:
                self._outbox.reset()
                self._outbox = None


def _ready(container: Container) -> bool:
    try:
        return container.database.ping() and container.broker_reachable()
    except ConfigurationError:
        return False


probes = APIRouter(tags=["probes"], route_class=ProblemRoute)


@probes.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text exposition format"}},
)
def prometheus_metrics(request: Request) -> Response:
    """Prometheus metrics (no authentication); the database gauges are read now."""
    request.app.state.gauges.refresh()
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@probes.get("/healthz", response_model=Health)
def liveness() -> Health:
    """The process is alive."""
    return Health(status="ok")


@probes.get("/readyz", response_model=Readiness, responses=problem_responses(503))
def readiness(request: Request) -> Readiness:
    """200 when the database answers and the broker is reachable (checked at most every 5 s), else 503.
    `warnings` names what is wrong without making the process unready: a tokens file that cannot be read or
    parsed (the operators read before stay in force, so every replica would otherwise leave the Service at
    once over one typo)."""
    if not request.app.state.ready():
        raise ProblemError(503, "IDENTITY_NOT_READY", "the database or the broker is unreachable")
    problem = request.app.state.operators.problem()
    return Readiness(status="ready", warnings=[problem] if problem else [])


# ---------------------------------------------------------------- the application


def _forbidden_to_viewers(document: dict[str, Any]) -> dict[str, Any]:
    """AdminGate answers 403 to a viewer's every admin action, whichever route it is: each says so."""
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            if path.startswith(_ADMIN_PATHS) and not AdminRole.VIEWER.permits(method):
                operation.setdefault("responses", {})["403"] = {
                    "description": f"The operator's role (viewer) may only read (code `{FORBIDDEN}`)"
                }
    return document


def _problem_json_errors(document: dict[str, Any]) -> dict[str, Any]:
    """Error answers are `application/problem+json` Problems (FastAPI would say application/json, and
    describe 422 with its own validation error model)."""
    problem = {"schema": {"$ref": "#/components/schemas/Problem"}}
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for status, answer in operation.get("responses", {}).items():
                if str(status)[0] in "45":
                    answer["content"] = {PROBLEM_JSON: problem}
    schemas = document.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return document


class AdminApi(FastAPI):
    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = _problem_json_errors(_forbidden_to_viewers(super().openapi()))
        return self.openapi_schema


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.gauges.close()


def create_app(container: Container) -> FastAPI:
    """The admin API over the container's adapters; refuses to exist without an operator
    (PIN_IDENTITY_ADMIN_TOKENS_FILE or PIN_IDENTITY_ADMIN_TOKEN) or with a tokens file it cannot use."""
    operators = Operators.from_settings(container.settings)
    app = AdminApi(
        title="pin-identity platform-admin API",
        version=__version__,
        description="Talent import runs, the access fan-out queue, role permissions (CONTRACTS section 6).",
        lifespan=_lifespan,
        generate_unique_id_function=lambda route: route.name,  # operationId = the handler's name
        # No /docs or /redoc: their pages load scripts from a CDN. The console and /openapi.json remain.
        docs_url=None,
        redoc_url=None,
    )
    app.state.container = container
    app.state.operators = operators
    app.state.gauges = DatabaseGauges(container)
    app.state.ready = ReadinessCache(lambda: _ready(container))
    for router in (imports, sync, fanout, roles, *admin_reads.routers, probes, console):
        app.include_router(router)
    app.add_exception_handler(StarletteHTTPException, handle_exception)
    app.add_exception_handler(RequestValidationError, handle_exception)
    app.add_middleware(AdminGate, operators=operators)
    return app


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ConfigurationError(f"--host/--port: cannot listen on {host}:{port} ({exc.strerror})") from None


def serve_admin_api(container: Container, *, host: str, port: int) -> None:
    """Run the API until SIGTERM/SIGINT. No operator, an unusable tokens file, an unreachable database or a
    busy port fail at start (ConfigurationError: exit 2)."""
    app = create_app(container)
    if not container.database.ping():
        raise ConfigurationError("PIN_IDENTITY_DATABASE_URL: database unreachable")
    listener = _listen(host, port)
    log.info("admin-api-started", host=host, port=listener.getsockname()[1], **app.state.operators.counts())
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; with these handlers in
    # place the process then ends normally (exit 0), like `worker` on SIGTERM/SIGINT.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    config = uvicorn.Config(app, log_config=None, access_log=False, server_header=False)
    uvicorn.Server(config).run(sockets=[listener])
    log.info("admin-api-stopped")

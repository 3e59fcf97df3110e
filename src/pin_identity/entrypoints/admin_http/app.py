"""The admin API's application: its routers, admission, problem answers and OpenAPI document, and `serve`'s
listening socket and lifetime."""

from __future__ import annotations

import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from pin_identity import __version__
from pin_identity.composition import Container
from pin_identity.config import ConfigurationError
from pin_identity.entrypoints.admin_http.access_routes import access
from pin_identity.entrypoints.admin_http.console import console
from pin_identity.entrypoints.admin_http.fanout_routes import fanout
from pin_identity.entrypoints.admin_http.gate import ADMIN_PATHS, FORBIDDEN, AdminGate
from pin_identity.entrypoints.admin_http.gauges import DatabaseGauges
from pin_identity.entrypoints.admin_http.health_routes import health
from pin_identity.entrypoints.admin_http.operators import operators as operators_router
from pin_identity.entrypoints.admin_http.probe_routes import probes
from pin_identity.entrypoints.admin_http.problems import PROBLEM_JSON, handle_exception
from pin_identity.entrypoints.admin_http.role_routes import roles
from pin_identity.entrypoints.admin_http.talent_import_routes import imports
from pin_identity.entrypoints.admin_http.talent_sync_routes import sync
from pin_identity.entrypoints.admin_http.tokens import Operators
from pin_identity.entrypoints.documents import AdminRole
from pin_identity.entrypoints.readiness import ReadinessCheck
from pin_identity.observability.logging import get_logger

log = get_logger("admin-http")

# ---------------------------------------------------------------- the application


def _forbidden_to_viewers(document: dict[str, Any]) -> dict[str, Any]:
    """AdminGate answers 403 to a viewer's every admin action, whichever route it is: each says so."""
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            if path.startswith(ADMIN_PATHS) and not AdminRole.VIEWER.permits(method):
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
    operators = Operators.from_settings(container.settings, container.clock)
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
    app.state.gauges = DatabaseGauges.of(container)
    app.state.scrapes = anyio.CapacityLimiter(1)  # /metrics: one scrape at a time (probes)
    app.state.readiness = ReadinessCheck.of(container, warning=operators.problem)
    for router in (imports, sync, fanout, roles, operators_router, health, access, probes, console):
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
    """Run the API until SIGTERM/SIGINT. No operator, an unusable tokens file, an unreachable database, a
    database role without serve's grants or a busy port fail at start (ConfigurationError: exit 2)."""
    app = create_app(container)
    if not container.connections.database.ping():
        raise ConfigurationError("PIN_IDENTITY_DATABASE_URL: database unreachable")
    container.connections.check_database_grants(["serve"])
    listener = _listen(host, port)
    log.info("admin-api-started", host=host, port=listener.getsockname()[1], **app.state.operators.counts())
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; with these handlers in
    # place the process then ends normally (exit 0), like `worker` on SIGTERM/SIGINT.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    config = uvicorn.Config(app, log_config=None, access_log=False, server_header=False)
    uvicorn.Server(config).run(sockets=[listener])
    log.info("admin-api-stopped")

"""What every `/admin/` router of `serve` shares: the bearer scheme it documents, the container and caller it
depends on, and the path parameters named as CONTRACTS section 6 names them. AdminGate (admin_http) checks the
token before any of this runs."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Request
from fastapi.security import HTTPBearer

from pin_identity.composition import Container
from pin_identity.entrypoints.admin_problems import ProblemRoute, problem_responses

# Documents the scheme in /openapi.json; AdminGate enforces it.
bearer = HTTPBearer(auto_error=False, description="The value of PIN_IDENTITY_ADMIN_TOKEN.")


def caller(request: Request) -> str:
    """Who asked, for the audit line: the client address, never the token."""
    return f"http:{request.client.host if request.client else 'unknown'}"


def _container(request: Request) -> Container:
    container: Container = request.app.state.container
    return container


ContainerDep = Annotated[Container, Depends(_container)]
Who = Annotated[str, Depends(caller)]
RunId = Annotated[UUID, Path(alias="runId", description="The import run.")]
TaskId = Annotated[UUID, Path(alias="taskId", description="The fan-out task.")]
RoleId = Annotated[UUID, Path(alias="roleId", description="The role.")]
UserId = Annotated[UUID, Path(alias="userId", description="The user.")]


def admin_router(prefix: str, tag: str) -> APIRouter:
    return APIRouter(
        prefix=prefix,
        tags=[tag],
        dependencies=[Depends(bearer)],
        responses=problem_responses(401, 413),
        route_class=ProblemRoute,
    )

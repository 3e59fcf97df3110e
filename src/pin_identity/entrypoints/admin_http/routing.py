"""What every `/admin/` router of `serve` shares: the bearer scheme it documents, the container, the signed-in
operator and the audit's actor it depends on, and the path parameters named as CONTRACTS section 6 names them.
AdminGate (gate) checks the token and the operator's role before any of this runs."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Path, Request
from fastapi.security import HTTPBearer

from pin_identity.composition import Container
from pin_identity.entrypoints.admin_http.problems import ProblemRoute, problem_responses
from pin_identity.entrypoints.admin_http.tokens import Operator
from pin_identity.operations.action_log import Actor

# Documents the scheme in /openapi.json; AdminGate enforces it.
bearer = HTTPBearer(
    auto_error=False,
    description="An operator's token: PIN_IDENTITY_ADMIN_TOKEN, or one whose sha256 is in the tokens file.",
)


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def signed_in(request: Request) -> Operator:
    """The operator AdminGate admitted this request for."""
    operator: Operator = request.state.operator
    return operator


def caller(request: Request) -> Actor:
    """Who asked, for the audit line: the operator's name and, beside it, the client address; no token."""
    return Actor(f"http:{signed_in(request).name}", client_address(request))


def _container(request: Request) -> Container:
    container: Container = request.app.state.container
    return container


ContainerDep = Annotated[Container, Depends(_container)]
SignedIn = Annotated[Operator, Depends(signed_in)]
Who = Annotated[Actor, Depends(caller)]
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

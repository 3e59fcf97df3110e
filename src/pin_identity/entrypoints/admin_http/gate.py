"""Admission to every `/admin/` route, before a byte of its body is read: the operator's token and role, and
the body's size (AdminGate)."""

from __future__ import annotations

from fastapi import Request
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pin_identity.entrypoints.admin_http.problems import ProblemError, problem_response
from pin_identity.entrypoints.admin_http.routing import caller, client_address
from pin_identity.entrypoints.admin_http.tokens import Operator, Operators
from pin_identity.observability.logging import get_logger

log = get_logger("admin-http")

# FastAPI reads and parses a request's body before any dependency runs, so a dependency cannot refuse a
# request before its body: an unauthenticated client could make the server wait for, and parse, any body.
MAX_BODY_BYTES = 1024 * 1024
ADMIN_PATHS = "/admin/"
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
        if scope["type"] != "http" or not scope["path"].startswith(ADMIN_PATHS):
            await self._app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            request.state.operator = await self._admit(request)
            _check_announced_size(request)
            body = await _read_body(request)
        except ProblemError as refusal:
            await _refuse(request, refusal, send)
        except _ClientGoneError:
            return
        else:
            await self._app(scope, _replaying(body, receive), send)

    async def _admit(self, request: Request) -> Operator:
        # On the event loop: the tokens file is never read here (a look at it runs on a thread of its own).
        operator = await self._operators.authenticate_waiting(_bearer_token(request.headers))
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

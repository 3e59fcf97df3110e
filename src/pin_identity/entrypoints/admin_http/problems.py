"""Every error of the admin HTTP API as RFC 9457 `application/problem+json` with a stable `code`.

ERRORS is the one table from an error to its answer: routes raise the operator service's errors (and the
container's) as they come, and ProblemRoute answers each by its class, most specific first. A code left out
of a row is the error's own `code` (domain.errors); an import refusal is answered by its kind."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import psycopg
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from pin_identity.config import ConfigurationError
from pin_identity.domain.errors import (
    BrokerUnavailableError,
    ConflictError,
    IdentityError,
    InvalidInputError,
    NotFoundError,
    SourceNotConfiguredError,
)
from pin_identity.domain.import_run import (
    ImportAlreadyRunningError,
    ImportErrorCode,
    ImportRefusedError,
    ImportSourceIncompleteError,
    ImportSourceUnavailableError,
)
from pin_identity.entrypoints.documents import Problem, ValidationIssue
from pin_identity.observability.logging import describe_error, get_logger

PROBLEM_JSON = "application/problem+json"
INVALID_REQUEST = "IDENTITY_INVALID_REQUEST"
DATABASE_UNAVAILABLE = "IDENTITY_DATABASE_UNAVAILABLE"

log = get_logger("admin-http")


class DatabaseUnavailableError(Exception):
    """The database did not answer a read the answer cannot go without (stale figures must not pass for the
    present)."""


@dataclass(frozen=True)
class Answer:
    status: int
    code: str | None = None  # None: the error's own `code`
    detail: str | None = None  # None: the error's message


_UNAVAILABLE = Answer(503, DATABASE_UNAVAILABLE, "the database is unavailable; try again")

ERRORS: tuple[tuple[type[BaseException], Answer], ...] = (
    # e.g. no PIN_IDENTITY_TALENT_API_URL for an api-pull run
    (SourceNotConfiguredError, Answer(503, ImportErrorCode.SOURCE_UNAVAILABLE.value)),
    (ImportAlreadyRunningError, Answer(409)),
    (ImportSourceUnavailableError, Answer(503)),
    (ImportSourceIncompleteError, Answer(503)),
    (ImportRefusedError, Answer(422)),  # an invalid request, a resume that does not match
    (NotFoundError, Answer(404)),
    (ConflictError, Answer(409)),
    (InvalidInputError, Answer(422)),
    (IdentityError, Answer(422)),
    (BrokerUnavailableError, Answer(503)),
    # e.g. PIN_IDENTITY_KAFKA_CONFIG sets a partitioner whose placement access show cannot compute
    (ConfigurationError, Answer(503, "IDENTITY_MISCONFIGURED")),
    (DatabaseUnavailableError, _UNAVAILABLE),
    (psycopg.OperationalError, _UNAVAILABLE),
    (PoolTimeout, _UNAVAILABLE),
)
_HTTP_CODES = {404: "IDENTITY_NOT_FOUND", 405: "IDENTITY_METHOD_NOT_ALLOWED"}


class ProblemError(Exception):
    """An error answer decided by the API itself (authentication, an unknown id, a state conflict)."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        errors: list[ValidationIssue] | None = None,
    ):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.headers, self.errors = headers, errors


def _validation_problem(exc: RequestValidationError) -> ProblemError:
    issues = [
        ValidationIssue(
            location=".".join(str(part) for part in error.get("loc", ())), message=str(error.get("msg"))
        )
        for error in exc.errors()
    ]
    summary = "; ".join(f"{issue.location}: {issue.message}" for issue in issues[:5])
    return ProblemError(422, INVALID_REQUEST, summary or "the request is invalid", errors=issues)


def _http_problem(exc: StarletteHTTPException) -> ProblemError:
    if exc.status_code == 400:  # FastAPI's "error parsing the body": bad input, which the contract makes 422
        return ProblemError(422, INVALID_REQUEST, str(exc.detail))
    code = _HTTP_CODES.get(exc.status_code, "IDENTITY_HTTP_ERROR")
    return ProblemError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}))


def _code_of(exc: BaseException) -> str:
    """The error's code (its class carries it: domain.errors), as an enum or as text."""
    code = getattr(exc, "code", "IDENTITY_ERROR")
    return str(getattr(code, "value", code))


def _tabled(exc: BaseException, answer: Answer) -> ProblemError:
    return ProblemError(answer.status, answer.code or _code_of(exc), answer.detail or str(exc))


def problem_for(exc: Exception) -> ProblemError:
    """What the client is told: a known failure keeps its code; anything else is an opaque 500."""
    if isinstance(exc, ProblemError):
        return exc
    if isinstance(exc, RequestValidationError):
        return _validation_problem(exc)
    if isinstance(exc, StarletteHTTPException):
        return _http_problem(exc)
    answer = next((answer for kind, answer in ERRORS if isinstance(exc, kind)), None)
    if answer is None:
        return ProblemError(500, "IDENTITY_INTERNAL_ERROR", "an unexpected error occurred")
    return _tabled(exc, answer)


def problem_response(request: Request, problem: ProblemError) -> JSONResponse:
    body = Problem.answering(problem.status, problem.code, problem.detail, request.url.path, problem.errors)
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=problem.headers,
    )


async def handle_exception(request: Request, exc: Exception) -> Response:
    """For failures raised outside a route's handler (no route matched, wrong method)."""
    return answer(request, exc)


def answer(request: Request, exc: Exception) -> JSONResponse:
    problem = problem_for(exc)
    if problem.status >= 500:
        # The class and first line only: a database error's detail lines quote rows (PII).
        log.error("admin-api-error", path=request.url.path, status=problem.status, error=describe_error(exc))
    return problem_response(request, problem)


class ProblemRoute(APIRoute):
    """Turns whatever a handler (or its dependencies, or FastAPI's validation) raises into a problem
    answer, so that no traceback and no exception text other than ours reaches the client or the logs."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # every failure becomes a problem answer
                return answer(request, exc)

        return guarded


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries (rewritten to `application/problem+json` when the document is built)."""
    described = {status: _RESPONSE_DESCRIPTIONS.get(status, HTTPStatus(status).phrase) for status in statuses}
    return {status: {"model": Problem, "description": text} for status, text in described.items()}


_RESPONSE_DESCRIPTIONS = {
    401: "Missing or wrong bearer token",
    404: "Unknown id",
    409: "Conflict with the current state",
    413: "Request body over 1 MiB (code `IDENTITY_REQUEST_TOO_LARGE`)",
    422: "Bad input (code `IDENTITY_INVALID_REQUEST` for a malformed request)",
    503: "A dependency is unavailable",
}

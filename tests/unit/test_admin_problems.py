"""The admin API's one table from an error to its answer: each error by its class, most specific first, an
import refusal's status by its kind, anything unknown an opaque 500."""

from __future__ import annotations

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from pin_identity.config import ConfigurationError
from pin_identity.domain.errors import (
    BrokerUnavailableError,
    ConflictError,
    IdentityError,
    ImportNotRunningError,
    InvalidInputError,
    NotFoundError,
    SourceNotConfiguredError,
)
from pin_identity.domain.import_run import (
    ImportAlreadyRunningError,
    ImportInvalidRequestError,
    ImportRefusedError,
    ImportResumeMismatchError,
    ImportSourceIncompleteError,
    ImportSourceUnavailableError,
)
from pin_identity.entrypoints.admin_http.problems import DatabaseUnavailableError, ProblemError, problem_for

UNAVAILABLE = (503, "IDENTITY_DATABASE_UNAVAILABLE", "the database is unavailable; try again")


@pytest.mark.parametrize(
    ("error", "answer"),
    [
        (NotFoundError("role 1 does not exist"), (404, "IDENTITY_NOT_FOUND", "role 1 does not exist")),
        (ConflictError("taken"), (409, "IDENTITY_CONFLICT", "taken")),
        (ImportNotRunningError("not running"), (409, "IDENTITY_IMPORT_NOT_RUNNING", "not running")),
        (InvalidInputError("bad"), (422, "IDENTITY_INVALID_INPUT", "bad")),
        (IdentityError("odd"), (422, "IDENTITY_ERROR", "odd")),
        (
            SourceNotConfiguredError("PIN_IDENTITY_TALENT_API_URL: required"),
            (503, "IDENTITY_IMPORT_SOURCE_UNAVAILABLE", "PIN_IDENTITY_TALENT_API_URL: required"),
        ),
        (BrokerUnavailableError("no broker"), (503, "IDENTITY_BROKER_UNAVAILABLE", "no broker")),
        (ConfigurationError("random partitioner"), (503, "IDENTITY_MISCONFIGURED", "random partitioner")),
        (DatabaseUnavailableError(), UNAVAILABLE),
        (psycopg.OperationalError("gone"), UNAVAILABLE),
        (PoolTimeout("no connection"), UNAVAILABLE),
        (RuntimeError("secret detail"), (500, "IDENTITY_INTERNAL_ERROR", "an unexpected error occurred")),
    ],
)
def test_each_error_is_answered_by_its_class(error: Exception, answer: tuple[int, str, str]) -> None:
    problem = problem_for(error)
    assert (problem.status, problem.code, problem.detail) == answer


@pytest.mark.parametrize(
    ("refusal", "status"),
    [
        (ImportAlreadyRunningError, 409),
        (ImportInvalidRequestError, 422),
        (ImportResumeMismatchError, 422),
        (ImportSourceUnavailableError, 503),
        (ImportSourceIncompleteError, 503),
    ],
)
def test_an_import_refusal_is_answered_by_its_kind_with_its_code(
    refusal: type[ImportRefusedError], status: int
) -> None:
    problem = problem_for(refusal("why"))
    assert (problem.status, problem.code, problem.detail) == (status, refusal.code.value, "why")


def test_an_answer_the_api_decided_itself_passes_as_it_is() -> None:
    decided = ProblemError(401, "IDENTITY_UNAUTHORIZED", "a valid bearer token is required")
    assert problem_for(decided) is decided

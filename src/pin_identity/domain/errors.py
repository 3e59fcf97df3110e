"""Domain errors: each carries a stable code that the CLI and the HTTP API report."""

from __future__ import annotations


class IdentityError(Exception):
    code = "IDENTITY_ERROR"


class NotFoundError(IdentityError):
    code = "IDENTITY_NOT_FOUND"


class ConflictError(IdentityError):
    code = "IDENTITY_CONFLICT"


class InvalidInputError(IdentityError):
    code = "IDENTITY_INVALID_INPUT"


class ImportNotRunningError(ConflictError):
    """Only a Running import run can be cancelled (the HTTP API answers 409 with the same code)."""

    code = "IDENTITY_IMPORT_NOT_RUNNING"

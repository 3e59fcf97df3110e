"""Errors of the domain and of its ports (adapters raise these): each kind has one home, here; the import's
refusals sit beside their codes (`ImportRefusedError` in `domain/import_run.py`).

One hierarchy, and a code is always a class attribute (the contract's code, CONTRACTS sections 2 and 6):

    ServiceError                 raised on purpose; others are unexpected      IDENTITY_INTERNAL_ERROR
    ├── IdentityError            a request refused: its input or the state     IDENTITY_ERROR
    │   ├── NotFoundError, ConflictError (ImportNotRunningError), InvalidInputError
    │   └── ImportRefusedError   one subclass per IDENTITY_IMPORT_* refusal
    ├── ConfigurationError       a setting is missing or wrong (config.py)     IDENTITY_MISCONFIGURED
    ├── SourceNotConfiguredError, SourceUnavailableError (SourceRejectedError): Talent cannot be read
    ├── BrokerUnavailableError   the broker did not answer, or refused          IDENTITY_BROKER_UNAVAILABLE
    └── LeaseLostError, StoreConflictError, OutboxIdsWentBackError: what a job handles itself

Each entry point maps a class to what its caller sees in one table: the command line's exit status in
`entrypoints/cli_common.py`, the HTTP status in `entrypoints/admin_http/problems.py`.
"""

from __future__ import annotations

from typing import ClassVar


class ServiceError(Exception):
    """Every error this service raises on purpose; `code` names its kind."""

    code: ClassVar[str] = "IDENTITY_INTERNAL_ERROR"


class IdentityError(ServiceError):
    """A request refused because of its input or the current state (CLI exit 2, HTTP 4xx)."""

    code: ClassVar[str] = "IDENTITY_ERROR"


class NotFoundError(IdentityError):
    code = "IDENTITY_NOT_FOUND"


class ConflictError(IdentityError):
    code = "IDENTITY_CONFLICT"


class InvalidInputError(IdentityError):
    code = "IDENTITY_INVALID_INPUT"


class ImportNotRunningError(ConflictError):
    """Only a Running import run can be cancelled (the HTTP API answers 409 with the same code)."""

    code = "IDENTITY_IMPORT_NOT_RUNNING"


class OutboxIdsWentBackError(ServiceError):
    """The outbox's id sequence stands below what the relay already read (a `TRUNCATE ... RESTART IDENTITY`
    or an `ALTER SEQUENCE ... RESTART`): rows written since lie below the relay's read position."""

    def __init__(self, read_up_to: int, now_at: int):
        super().__init__(f"the outbox id sequence went back from {read_up_to} to {now_at}")
        self.read_up_to, self.now_at = read_up_to, now_at


class LeaseLostError(ServiceError):
    """The task's lease now belongs to another claim: this worker must not write for it any more."""


class StoreConflictError(ServiceError):
    """A unique constraint refused a write; `field` names what collided (`phone`, ...)."""

    def __init__(self, field: str):
        super().__init__(f"unique conflict on {field}")
        self.field = field


class SourceUnavailableError(ServiceError):
    """Talent cannot be read now (down, timing out, malformed answers); worth trying again later. The jobs
    handle it; a use case says it to its caller as ImportSourceUnavailableError, whose code that is."""


class SourceRejectedError(SourceUnavailableError):
    """Talent refuses our credentials (401/403): retrying will not help."""


class SourceNotConfiguredError(ServiceError):
    """This process has no way to read the run's source (e.g. api-pull without the Talent API URL); the
    message names the variable to set. To a client starting a run the source is as good as unavailable: the
    HTTP API answers it with ImportSourceUnavailableError's code, the CLI as a configuration failure."""


class BrokerUnavailableError(ServiceError):
    """The broker did not answer in time, refused, or this process has none configured: a read of the access
    topic, a consumer group's lag. Where the message names the variable to check (`access show`), the CLI says
    it as a configuration failure (exit 2) and the HTTP API answers 503."""

    code = "IDENTITY_BROKER_UNAVAILABLE"

"""Errors of the domain and of its ports (adapters raise these): each kind has one home, here."""

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


class OutboxIdsWentBackError(Exception):
    """The outbox's id sequence stands below what the relay already read (a `TRUNCATE ... RESTART IDENTITY`
    or an `ALTER SEQUENCE ... RESTART`): rows written since lie below the relay's read position."""

    def __init__(self, read_up_to: int, now_at: int):
        super().__init__(f"the outbox id sequence went back from {read_up_to} to {now_at}")
        self.read_up_to, self.now_at = read_up_to, now_at


class LeaseLostError(Exception):
    """The task's lease now belongs to another claim: this worker must not write for it any more."""


class StoreConflictError(Exception):
    """A unique constraint refused a write; `field` names what collided (`phone`, ...)."""

    def __init__(self, field: str):
        super().__init__(f"unique conflict on {field}")
        self.field = field


class SourceUnavailableError(Exception):
    """Talent cannot be read now (down, timing out, malformed answers); worth trying again later."""


class SourceRejectedError(SourceUnavailableError):
    """Talent refuses our credentials (401/403): retrying will not help."""


class SourceNotConfiguredError(Exception):
    """This process has no way to read the run's source (e.g. api-pull without the Talent API URL)."""


class ConsumerLagUnavailableError(Exception):
    """The broker did not say how far a group is behind: it did not answer in time, refused, or this process
    has no broker configured."""


class AccessLogUnavailableError(Exception):
    """The access topic could not be read (the broker did not answer in time, or refused the read)."""

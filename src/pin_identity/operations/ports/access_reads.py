"""The access topic read back against the database's truth: the whole topic for `access audit`, one user's
last event for `access show`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from pydantic import Field

from pin_identity.domain.access_verdicts import Fingerprint, LastEvent, UserKey
from pin_identity.domain.api_model import ApiModel

# (records read, records the topic held when reading began)
Progress = Callable[[int, int], None]
# Receives the records read, a batch at a time, in the order of each partition.
KeepRecords = Callable[[Sequence[LastEvent]], None]


# ---------------------------------------------------------------- one user's (`access show`)


# Fields the record's value did not carry readably are None; an unreadable `active_assignments` matches no
# truth.
class AccessEventOnTopic(ApiModel):
    """The user's last record on pin.identity.access.v1, as far as its value could be read."""

    partition: int
    offset: int
    event_id: str | None
    version: int | None
    change_reason: str | None
    changed_role_id: str | None
    occurred_at: datetime | None
    active_assignments: Any = Field(description="The event's activeAssignments as it was sent.")


@dataclass(frozen=True)
class AccessLogSearch:
    """Where the user's key goes on the access topic (None: the topic does not exist), how much of that
    partition was read from its end, and the user's last event there (None: not one since its beginning)."""

    partition: int | None
    records_read: int
    last_event: AccessEventOnTopic | None


# A UserAccessChanged of the user still in the outbox, or refused by the broker for good (`error`).
class QueuedAccessEventView(ApiModel):
    outbox_id: int
    event_id: UUID
    change_reason: str | None
    version: int | None
    queued_at: datetime
    error: str | None = Field(description="A dead letter's: why the broker refused it for good.")


@dataclass(frozen=True)
class UserAccessState:
    """The database's side, read in one snapshot."""

    user_id: UUID
    company_id: UUID | None
    active_assignments: list[dict[str, Any]]  # rendered as the event's activeAssignments
    waiting: tuple[QueuedAccessEventView, ...]  # in the outbox, oldest first
    dead_letters: tuple[QueuedAccessEventView, ...]


@dataclass(frozen=True)
class TopicRead:
    records: int
    # Partitions that could not be read to the end offsets taken when reading began.
    incomplete: list[int] = field(default_factory=list)


class AccessLog(Protocol):
    def read(self, keep: KeepRecords, progress: Progress) -> TopicRead:
        """Every partition of the access topic from its beginning to the end offsets taken when reading
        begins (what is written after that is the next audit's business)."""
        ...


class TruthSnapshot(Protocol):
    def pending(self) -> frozenset[UserKey]:
        """Users with an access event in the outbox, not yet published."""
        ...

    def truths(self) -> Iterator[tuple[UserKey, Fingerprint]]:
        """Every user holding an Active assignment, with the fingerprint of those assignments, by user key."""
        ...

    def last_events(self) -> Iterator[LastEvent]:
        """The last record kept of each user, by user key."""
        ...


class AuditSession(Protocol):
    def keep(self, records: Sequence[LastEvent]) -> None:
        """Keep records read from the topic (a later record of a user supersedes an earlier one)."""
        ...

    def snapshot(self) -> AbstractContextManager[TruthSnapshot]:
        """One consistent view of the database (pending rows and assignments as of the same moment)."""
        ...


class AccessTruth(Protocol):
    def session(self) -> AbstractContextManager[AuditSession]:
        """Where one audit keeps the topic's records (off the heap: a million users in bounded memory)."""
        ...


# ---------------------------------------------------------------- one user (`access show`)


class UserAccessLog(Protocol):
    def last_event(self, user_id: UUID) -> AccessLogSearch:
        """The user's last record, searched from the end of the one partition their key goes to;
        BrokerUnavailableError when the broker does not answer."""
        ...


class UserAccessStates(Protocol):
    def user_exists(self, user_id: UUID) -> bool: ...

    def user_state(self, user_id: UUID) -> UserAccessState | None:
        """Active assignments and the user's access events not yet published, as of one moment."""
        ...

"""The access topic read back against the database's truth: the whole topic for `access audit`, one user's
last event for `access show`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol
from uuid import UUID

from pin_identity.domain.access_verdicts import Fingerprint, LastEvent, UserKey
from pin_identity.operations.read_models import AccessLogSearch, UserAccessState

# (records read, records the topic held when reading began)
Progress = Callable[[int, int], None]
# Receives the records read, a batch at a time, in the order of each partition.
KeepRecords = Callable[[Sequence[LastEvent]], None]


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

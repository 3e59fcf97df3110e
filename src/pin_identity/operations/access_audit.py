"""`access audit`: the access topic's last event per user against the database's current truth."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from pin_identity.domain.access_audit import AuditReport, Fingerprint, UserKey, compare

# (records read, records the topic held when reading began)
Progress = Callable[[int, int], None]


class AccessLog(Protocol):
    def last_fingerprints(self, progress: Progress) -> dict[UserKey, Fingerprint]:
        """Every partition of the access topic from its beginning to its end: each user's last event."""
        ...


class TruthSnapshot(Protocol):
    def pending(self) -> frozenset[UserKey]:
        """Users with an access event in the outbox, not yet published."""
        ...

    def truths(self) -> Iterator[tuple[UserKey, Fingerprint]]:
        """Every user holding an Active assignment, with the fingerprint of those assignments."""
        ...


class AccessTruth(Protocol):
    def snapshot(self) -> AbstractContextManager[TruthSnapshot]:
        """One consistent view of the database (pending rows and assignments as of the same moment)."""
        ...


def audit_access(log: AccessLog, truth: AccessTruth, progress: Progress) -> AuditReport:
    # The topic first, then the database: a change committed meanwhile is still in the outbox (pending)
    # unless its event was published in the moment between the two, which shows as drift that a second
    # audit no longer finds. On a quiet system (the outbox drained) the answer is exact.
    last_events = log.last_fingerprints(progress)
    with truth.snapshot() as snapshot:
        return compare(last_events, snapshot.truths(), snapshot.pending())

"""The access audit's rules: does the last UserAccessChanged of each user carry that user's current truth?

CONTRACTS section 4 (convergence): once the outbox is drained, the last event of every user on the access
topic carries exactly that user's Active assignments. The audit keeps one fingerprint per user (not the
events), so it reads a topic of millions of users in bounded memory. `access show` judges one user by the
same rule (`verdict`) and says which assignments differ (`difference`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, MutableMapping, Set
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# A user key is the 16 bytes of the user's uuid; a fingerprint is 8 bytes of a hash, kept as an int.
UserKey = bytes
Fingerprint = int

MAX_EXAMPLES = 20
# The fingerprint of an event whose activeAssignments cannot be read: it matches no truth.
UNREADABLE: Fingerprint = -1


def fingerprint(active_assignments: Any) -> Fingerprint:
    """The same value for equal assignment lists however they were written (key order, spacing)."""
    if not isinstance(active_assignments, list):
        return UNREADABLE
    canonical = json.dumps(active_assignments, sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "big")


NO_ASSIGNMENTS = fingerprint([])


class Verdict(StrEnum):
    MATCHING = "matching"
    DRIFTED = "drifted"
    MISSING = "missing"
    PENDING = "pending"

    @property
    def converged(self) -> bool:
        """Nothing to repair: the topic carries the truth, or the outbox is about to."""
        return self in (Verdict.MATCHING, Verdict.PENDING)


def verdict(last: Fingerprint | None, truth: Fingerprint, *, pending: bool) -> Verdict:
    """One user: `last` is the fingerprint of their last event on the topic (None: no event), `truth` that of
    their Active assignments now. A user with an access event still in the outbox is pending, whatever the
    topic says; one with neither an event nor an Active assignment has nothing to carry."""
    if pending:
        return Verdict.PENDING
    if last is None:
        return Verdict.MATCHING if truth == NO_ASSIGNMENTS else Verdict.MISSING
    return Verdict.MATCHING if last == truth else Verdict.DRIFTED


@dataclass(frozen=True)
class AssignmentDifference:
    """Assignment ids by where they stand. `only_on_topic`: what consumers still grant and the database no
    longer holds Active (the incident's first question); `only_in_database`: what consumers do not know yet;
    `changed`: the same assignment with other fields (role code, scope, expiry)."""

    only_in_database: tuple[str, ...] = ()
    only_on_topic: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()


def difference(database: Any, topic: Any) -> AssignmentDifference:
    """Both sides as activeAssignments arrays (the event's wire form); entries without an id are ignored."""
    ours, theirs = _by_id(database), _by_id(topic)
    return AssignmentDifference(
        only_in_database=tuple(sorted(ours.keys() - theirs.keys())),
        only_on_topic=tuple(sorted(theirs.keys() - ours.keys())),
        changed=tuple(sorted(a for a in ours.keys() & theirs.keys() if ours[a] != theirs[a])),
    )


def _by_id(assignments: Any) -> dict[str, Any]:
    if not isinstance(assignments, list):
        return {}
    return {
        item["assignmentId"]: item
        for item in assignments
        if isinstance(item, dict) and isinstance(item.get("assignmentId"), str)
    }


@dataclass
class AuditReport:
    users: int = 0
    matching: int = 0
    drifted: int = 0
    missing: int = 0
    pending: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def converged(self) -> bool:
        return self.drifted == 0 and self.missing == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "users": self.users,
            "matching": self.matching,
            "drifted": self.drifted,
            "missing": self.missing,
            "pending": self.pending,
            "examples": self.examples,
        }

    def count(self, user: UserKey, judged: Verdict) -> None:
        self.users += 1
        match judged:
            case Verdict.MATCHING:
                self.matching += 1
            case Verdict.PENDING:
                self.pending += 1
            case Verdict.MISSING:
                self.missing += 1
            case Verdict.DRIFTED:
                self.drifted += 1
        if not judged.converged and len(self.examples) < MAX_EXAMPLES:
            self.examples.append(_uuid_text(user))


def compare(
    last_events: MutableMapping[UserKey, Fingerprint],
    truths: Iterable[tuple[UserKey, Fingerprint]],
    pending: Set[UserKey],
) -> AuditReport:
    """`truths`: every user with an Active assignment; a user only on the topic must have none.

    Consumes `last_events` (each user is popped once judged), so the caller's memory shrinks as it goes.
    A user with an outbox row not yet published is pending, whatever the topic says.
    """
    report = AuditReport()
    for user, truth in truths:
        report.count(user, verdict(last_events.pop(user, None), truth, pending=user in pending))
    for user, last in last_events.items():
        report.count(user, verdict(last, NO_ASSIGNMENTS, pending=user in pending))
    last_events.clear()
    return report


def _uuid_text(user: UserKey) -> str:
    hexed = user.hex()
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"

"""The access audit's rules: does the last UserAccessChanged of each user carry that user's current truth?

CONTRACTS section 4 (convergence): once the outbox is drained, the last event of every user on the access
topic carries exactly that user's Active assignments. The audit keeps one fingerprint per user (not the
events), so it reads a topic of millions of users in bounded memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, MutableMapping, Set
from dataclasses import dataclass, field
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

    def _example(self, user: UserKey) -> None:
        if len(self.examples) < MAX_EXAMPLES:
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
        _judge(report, user, last_events.pop(user, None), truth, pending)
    for user, last in last_events.items():
        _judge(report, user, last, NO_ASSIGNMENTS, pending)
    last_events.clear()
    return report


def _judge(
    report: AuditReport, user: UserKey, last: Fingerprint | None, truth: Fingerprint, pending: Set[UserKey]
) -> None:
    report.users += 1
    if user in pending:
        report.pending += 1
    elif last is None:
        report.missing += 1
        report._example(user)
    elif last != truth:
        report.drifted += 1
        report._example(user)
    else:
        report.matching += 1


def _uuid_text(user: UserKey) -> str:
    hexed = user.hex()
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"

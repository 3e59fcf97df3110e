"""The access audit's rules: does the last UserAccessChanged of each user carry that user's current truth?

CONTRACTS section 4 (convergence): once the outbox is drained, the last event of every user on the access
topic carries exactly that user's Active assignments. The audit compares two streams ordered by user id,
each user's last event and each user's truth, as one merge: its memory does not grow with the users.
`access show` judges one user by the same rule (`verdict`) and says which assignments differ (`difference`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Set
from enum import StrEnum
from typing import Any

import orjson
from pydantic import Field

from pin_identity.domain.api_model import ApiModel

# A user key is the 16 bytes of the user's uuid (ordered as PostgreSQL orders uuids); a fingerprint is 8 bytes
# of a hash, kept as a signed int (a bigint column holds it).
UserKey = bytes
Fingerprint = int
# A user's last record on the topic: its fingerprint, or None for a tombstone (the user's events deleted).
LastEvent = tuple[UserKey, Fingerprint | None]

MAX_EXAMPLES = 20
# The fingerprint of an event whose activeAssignments cannot be read: it matches no truth.
UNREADABLE: Fingerprint = -1


def fingerprint(active_assignments: Any) -> Fingerprint:
    """The same value for equal assignment lists however they were written (key order, spacing); compared
    only with fingerprints taken by this function in the same run (an audit, an `access show`)."""
    if not isinstance(active_assignments, list):
        return UNREADABLE
    # orjson, not json: the audit fingerprints two million lists, and json's encoder was a third of its time.
    try:
        canonical = orjson.dumps(active_assignments, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # what orjson cannot write (an integer past 64 bits) matches no truth
        return UNREADABLE
    return int.from_bytes(hashlib.blake2b(canonical, digest_size=8).digest(), "big", signed=True)


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


# Assignment ids by where they stand. `only_on_topic`: what consumers still grant and the database no longer
# holds Active (the incident's first question); `only_in_database`: what consumers do not know yet; `changed`:
# the same assignment with other fields. (`access show`'s document, whose schema has no description.)
class AssignmentDifferenceView(ApiModel):
    only_in_database: list[str] = Field(description="Active now, not in the last event: consumers lack it.")
    only_on_topic: list[str] = Field(
        description="In the last event, not Active now: consumers still grant it."
    )
    changed: list[str] = Field(description="In both, with other fields (role code, scope, expiry).")


def difference(database: Any, topic: Any) -> AssignmentDifferenceView:
    """Both sides as activeAssignments arrays (the event's wire form); entries without an id are ignored."""
    ours, theirs = _by_id(database), _by_id(topic)
    return AssignmentDifferenceView(
        only_in_database=sorted(ours.keys() - theirs.keys()),
        only_on_topic=sorted(theirs.keys() - ours.keys()),
        changed=sorted(a for a in ours.keys() & theirs.keys() if ours[a] != theirs[a]),
    )


def _by_id(assignments: Any) -> dict[str, Any]:
    if not isinstance(assignments, list):
        return {}
    return {
        item["assignmentId"]: item
        for item in assignments
        if isinstance(item, dict) and isinstance(item.get("assignmentId"), str)
    }


class AuditReport(ApiModel):
    """`access audit --json`: users by verdict, some of those not converged, and the partitions not read to
    the end offsets taken when the audit began (stalled or unreachable): the counts then say nothing of the
    users whose events lie there."""

    users: int = 0
    matching: int = 0
    drifted: int = 0
    missing: int = 0
    pending: int = 0
    examples: list[str] = Field(default_factory=list)
    incomplete_partitions: list[int] = Field(default_factory=list)

    @property
    def converged(self) -> bool:
        return self.drifted == 0 and self.missing == 0


def compare(
    last_events: Iterable[LastEvent], truths: Iterable[tuple[UserKey, Fingerprint]], pending: Set[UserKey]
) -> AuditReport:
    """Both streams ordered by user key. `truths`: every user with an Active assignment; a user only on the
    topic must have none. A user with an outbox row not yet published is pending, whatever the topic says."""
    # Counted in plain locals and made a report once: the audit judges millions of users.
    tally: Counter[Verdict] = Counter()
    examples: list[str] = []
    for user, last, truth in _merge(iter(last_events), iter(truths)):
        if last is not None or truth != NO_ASSIGNMENTS:  # a user only tombstoned on the topic is no one's
            judged = verdict(last, truth, pending=user in pending)
            tally[judged] += 1
            if not judged.converged and len(examples) < MAX_EXAMPLES:
                examples.append(_uuid_text(user))
    return AuditReport(
        users=tally.total(),
        matching=tally[Verdict.MATCHING],
        drifted=tally[Verdict.DRIFTED],
        missing=tally[Verdict.MISSING],
        pending=tally[Verdict.PENDING],
        examples=examples,
    )


def _merge(
    last_events: Iterator[LastEvent], truths: Iterator[tuple[UserKey, Fingerprint]]
) -> Iterator[tuple[UserKey, Fingerprint | None, Fingerprint]]:
    """(user, last event or None, truth) for every user of either stream, in key order."""
    last, truth = next(last_events, None), next(truths, None)
    while last is not None or truth is not None:
        if last is not None and (truth is None or last[0] < truth[0]):
            yield last[0], last[1], NO_ASSIGNMENTS
            last = next(last_events, None)
        elif truth is not None and (last is None or truth[0] < last[0]):
            yield truth[0], None, truth[1]
            truth = next(truths, None)
        elif last is not None and truth is not None:  # the same user in both
            yield truth[0], last[1], truth[1]
            last, truth = next(last_events, None), next(truths, None)


def _uuid_text(user: UserKey) -> str:
    hexed = user.hex()
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"

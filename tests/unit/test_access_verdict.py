"""One user's verdict and the difference of the two assignment lists (`access show`), and the audit counting
by the same rule."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from pin_identity.domain.access_verdicts import (
    NO_ASSIGNMENTS,
    UNREADABLE,
    AssignmentDifferenceView,
    Verdict,
    compare,
    difference,
    fingerprint,
    verdict,
)


def _assignment(assignment_id: str, **changes: Any) -> dict[str, Any]:
    return {"assignmentId": assignment_id, "roleCode": "sales-manager", "expiresAt": None, **changes}


HELD = [_assignment("a"), _assignment("b")]


@pytest.mark.parametrize(
    ("last", "truth", "pending", "expected"),
    [
        (fingerprint(HELD), fingerprint(HELD), False, Verdict.MATCHING),
        # Both sides are sorted by assignmentId on the wire: another order is another list.
        (fingerprint(list(reversed(HELD))), fingerprint(HELD), False, Verdict.DRIFTED),
        (fingerprint(HELD[:1]), fingerprint(HELD), False, Verdict.DRIFTED),
        (UNREADABLE, fingerprint(HELD), False, Verdict.DRIFTED),
        (UNREADABLE, NO_ASSIGNMENTS, False, Verdict.DRIFTED),
        (None, fingerprint(HELD), False, Verdict.MISSING),
        (None, NO_ASSIGNMENTS, False, Verdict.MATCHING),  # nothing to carry
        (fingerprint([]), NO_ASSIGNMENTS, False, Verdict.MATCHING),
        (None, fingerprint(HELD), True, Verdict.PENDING),
        (fingerprint(HELD[:1]), fingerprint(HELD), True, Verdict.PENDING),
    ],
)
def test_verdict(last: int | None, truth: int, pending: bool, expected: Verdict) -> None:
    assert verdict(last, truth, pending=pending) is expected
    assert expected.converged == (expected in (Verdict.MATCHING, Verdict.PENDING))


def test_difference_by_assignment_id() -> None:
    database = [_assignment("a"), _assignment("b", expiresAt="2027-01-01T00:00:00.000000Z"), _assignment("c")]
    topic = [_assignment("a"), _assignment("b"), _assignment("d"), {"no": "id"}, "junk"]
    assert difference(database, topic) == AssignmentDifferenceView(
        only_in_database=["c"], only_on_topic=["d"], changed=["b"]
    )
    assert difference(database, None) == AssignmentDifferenceView(
        only_in_database=["a", "b", "c"], only_on_topic=[], changed=[]
    )
    assert difference([], {"not": "a list"}) == AssignmentDifferenceView(
        only_in_database=[], only_on_topic=[], changed=[]
    )


def test_the_audit_counts_by_the_same_rule() -> None:
    users = [uuid.uuid4().bytes for _ in range(5)]
    matching, drifted, missing, pending, only_on_topic = users
    last_events = {
        matching: fingerprint(HELD),
        drifted: fingerprint(HELD[:1]),
        pending: fingerprint(HELD[:1]),
        only_on_topic: fingerprint([]),  # revoked and announced: matches a user with nothing
    }
    truths = [(u, fingerprint(HELD)) for u in (matching, drifted, missing, pending)]
    report = compare(sorted(last_events.items()), sorted(truths), frozenset({pending}))
    assert (report.users, report.matching, report.drifted, report.missing, report.pending) == (5, 2, 1, 1, 1)
    assert sorted(report.examples) == sorted(str(uuid.UUID(bytes=u)) for u in (drifted, missing))


def test_a_fingerprint_ignores_how_the_list_was_written_and_nothing_else() -> None:
    written_otherwise = json.loads(
        '[{"expiresAt":null,  "roleCode": "sales-manager","assignmentId":"a"},'
        ' {"roleCode":"sales-manager","assignmentId":"b","expiresAt":null}]'
    )
    assert fingerprint(written_otherwise) == fingerprint(HELD)
    assert fingerprint([_assignment("a"), _assignment("b", roleCode="sales-manager ")]) != fingerprint(HELD)
    assert fingerprint([_assignment("a", expiresAt=1)]) != fingerprint([_assignment("a", expiresAt=1.0)])


@pytest.mark.parametrize("unreadable", [None, {"assignmentId": "a"}, "[]", [_assignment("a", n=2**64)]])
def test_what_is_no_list_or_cannot_be_written_matches_no_truth(unreadable: object) -> None:
    assert fingerprint(unreadable) == UNREADABLE

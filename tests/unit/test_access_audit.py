"""The audit's verdict from two streams ordered by user: the topic's last events and the database's truths;
and the user a record's key names."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from pin_identity.adapters.kafka.access_log import _user_key
from pin_identity.domain.access_verdicts import NO_ASSIGNMENTS, compare, fingerprint

HOLDS = fingerprint([{"assignmentId": "a", "roleId": "r"}])
OTHER = fingerprint([{"assignmentId": "b", "roleId": "r"}])


def _users(count: int) -> list[bytes]:
    return sorted(uuid.uuid4().bytes for _ in range(count))


def test_each_user_is_judged_once_whichever_stream_holds_it() -> None:
    matching, drifted, missing, revoked, tombstoned, pending = _users(6)
    last_events = [(matching, HOLDS), (drifted, OTHER), (revoked, NO_ASSIGNMENTS), (tombstoned, None)]
    truths = [(matching, HOLDS), (drifted, HOLDS), (missing, HOLDS), (pending, HOLDS)]

    report = compare(sorted(last_events), sorted(truths), pending={pending})

    assert (report.users, report.matching, report.drifted, report.missing, report.pending) == (5, 2, 1, 1, 1)
    assert set(report.examples) == {str(uuid.UUID(bytes=drifted)), str(uuid.UUID(bytes=missing))}


def test_a_user_only_on_the_topic_must_hold_nothing() -> None:
    [user] = _users(1)
    assert compare([(user, OTHER)], [], pending=set()).drifted == 1
    assert compare([(user, NO_ASSIGNMENTS)], [], pending=set()).matching == 1


@given(st.dictionaries(st.binary(min_size=16, max_size=16), st.sampled_from([HOLDS, OTHER, None])))
def test_the_merge_counts_what_a_lookup_would(topic: dict[bytes, int | None]) -> None:
    truths = {user: HOLDS for user in list(topic)[::2]}
    report = compare(sorted(topic.items()), sorted(truths.items()), pending=set())

    judged = {user for user, last in topic.items() if last is not None} | set(truths)
    expected_matching = sum(
        1
        for user in judged
        if topic.get(user) is not None and topic[user] == truths.get(user, NO_ASSIGNMENTS)
    )
    assert report.users == len(judged)
    assert report.matching == expected_matching
    assert report.missing == sum(1 for user in truths if topic.get(user) is None)


def _uuid_parse(key: bytes | None) -> bytes | None:
    """What the audit read a key as before it had a fast path: uuid's own parse, None where it fails."""
    try:
        return uuid.UUID(key.decode() if key is not None else "None").bytes
    except ValueError:
        return None


@given(
    st.one_of(
        st.uuids().map(lambda u: str(u).encode()),
        st.uuids().map(lambda u: str(u).upper().encode()),
        st.text("0123456789abcdefABCDEF- {}", min_size=30, max_size=40).map(str.encode),
        # The canonical form with one character changed: a dash, a space or a non-hex letter inside it.
        st.builds(
            lambda u, at, char: (str(u)[:at] + char + str(u)[at + 1 :]).encode(),
            st.uuids(),
            st.integers(0, 35),
            st.sampled_from(["-", " ", "g", "é", "0"]),
        ),
        st.binary(min_size=36, max_size=36),
        st.none(),
    )
)
def test_a_record_key_reads_as_uuid_reads_it(key: bytes | None) -> None:
    assert _user_key(key) == _uuid_parse(key)

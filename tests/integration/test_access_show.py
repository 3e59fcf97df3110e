"""`access show` on the real database and broker: users made matching, pending, drifted and missing by the
real use cases (and by SQL behind the service's back), and a last event found far from its partition's end."""

from __future__ import annotations

import json
import uuid
from uuid import UUID

import psycopg
import pytest
from confluent_kafka import Producer

from pin_identity.adapters.kafka.access_lookup import KafkaUserAccessLog
from pin_identity.adapters.kafka.partitioning import key_partition
from pin_identity.adapters.kafka.publisher import producer_config
from pin_identity.adapters.postgres.access_truth import PostgresAccessTruth
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.domain.access_audit import AssignmentDifference, Verdict
from pin_identity.domain.errors import NotFoundError
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.operations import identity
from pin_identity.operations.access_show import show_access
from tests.support import seed
from tests.support.relay import publish_outbox


def _sql(database_url: str, statement: str, *params: object) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(statement, params)


def _granted_user(container: Container) -> tuple[UUID, UUID, UUID]:
    """A user holding one role, its RoleAssigned published: (user, role, assignment)."""
    company = seed.company(container.transactions)
    role = seed.role(container.transactions, company)
    user = seed.user(container.transactions, company)
    assignment = seed.grant(container.transactions, user, role, company)
    publish_outbox(container)
    return user, role, assignment


def test_a_published_grant_is_matching_and_names_its_event(container: Container) -> None:
    user, role, assignment = _granted_user(container)
    shown = container.access_show(user)
    assert shown.verdict is Verdict.MATCHING
    assert [a["assignmentId"] for a in shown.state.active_assignments] == [str(assignment)]
    event = shown.search.last_event
    assert event is not None
    assert (event.change_reason, event.version, event.changed_role_id) == ("RoleAssigned", 1, str(role))
    assert event.active_assignments == shown.state.active_assignments
    assert event.partition == shown.search.partition
    assert shown.search.partition == key_partition(str(user).encode(), 3)  # the session broker's 3
    assert shown.state.waiting == () and shown.difference == AssignmentDifference()


def test_a_change_still_in_the_outbox_is_pending(container: Container) -> None:
    user, _, assignment = _granted_user(container)
    identity.revoke_role_assignment(container.transactions, identity.Context.fresh(SYSTEM_CLOCK), assignment)
    shown = container.access_show(user)
    assert shown.verdict is Verdict.PENDING
    assert [(e.change_reason, e.version) for e in shown.state.waiting] == [("RoleRevoked", 2)]
    assert shown.difference.only_on_topic == (str(assignment),)  # until the relay publishes the revoke

    publish_outbox(container)
    after = container.access_show(user)
    assert after.verdict is Verdict.MATCHING
    assert after.search.last_event is not None and after.search.last_event.change_reason == "RoleRevoked"
    assert after.state.active_assignments == [] and after.search.last_event.active_assignments == []


def test_a_revoke_behind_the_services_back_is_drift_the_topic_still_grants(
    container: Container, database_url: str
) -> None:
    user, _, assignment = _granted_user(container)
    _sql(database_url, "UPDATE identity.role_assignments SET status = 'Revoked' WHERE id = %s", assignment)
    shown = container.access_show(user)
    assert shown.verdict is Verdict.DRIFTED
    assert shown.difference == AssignmentDifference(only_on_topic=(str(assignment),))


def test_a_changed_scope_behind_the_services_back_is_drift_of_that_assignment(
    container: Container, database_url: str
) -> None:
    user, _, assignment = _granted_user(container)
    _sql(
        database_url,
        "UPDATE identity.role_assignments SET expires_at = now() + interval '1 day' WHERE id = %s",
        assignment,
    )
    shown = container.access_show(user)
    assert shown.verdict is Verdict.DRIFTED
    assert shown.difference == AssignmentDifference(changed=(str(assignment),))


def test_an_assignment_without_any_event_is_missing(
    container: Container, database_url: str, broker: str
) -> None:
    company = seed.company(container.transactions)
    role = seed.role(container.transactions, company)
    user = seed.user(container.transactions, company)
    granted = uuid.uuid4()
    _sql(
        database_url,
        "INSERT INTO identity.role_assignments (id, role_id, user_id, company_id, scope_type)"
        " VALUES (%s, %s, %s, %s, 'Platform')",
        granted,
        role,
        user,
        company,
    )
    publish_outbox(container)  # the company's and the user's own events: none on the access topic
    # Another user's event in the user's partition: the lookup reads it and finds none of the user's.
    producer = Producer(producer_config({"bootstrap.servers": broker}))
    partition = key_partition(str(user).encode(), 3)
    producer.produce(ACCESS_TOPIC, b"{}", str(uuid.uuid4()).encode(), partition=partition)
    assert producer.flush(10) == 0
    shown = container.access_show(user)
    assert shown.verdict is Verdict.MISSING
    assert shown.search.last_event is None and shown.search.records_read > 0
    assert shown.difference == AssignmentDifference(only_in_database=(str(granted),))


def test_a_user_with_no_assignment_and_no_event_has_nothing_to_carry(container: Container) -> None:
    user = seed.user(container.transactions, seed.company(container.transactions))
    publish_outbox(container)
    shown = container.access_show(user)
    assert (shown.verdict, shown.search.last_event, shown.state.active_assignments) == (
        Verdict.MATCHING,
        None,
        [],
    )


def test_a_dead_lettered_access_event_is_shown_beside_the_drift_it_leaves(
    container: Container, database_url: str
) -> None:
    user, _, assignment = _granted_user(container)
    identity.revoke_role_assignment(container.transactions, identity.Context.fresh(SYSTEM_CLOCK), assignment)
    # What the relay does with an event the broker refuses for good.
    _sql(
        database_url,
        "WITH moved AS (DELETE FROM identity.outbox_events WHERE message_key = %s RETURNING *)"
        " INSERT INTO identity.outbox_dead_letters (id, event_id, topic, message_key, event_type,"
        " correlation_id, traceparent, value, error, created_at)"
        " SELECT id, event_id, topic, message_key, event_type, correlation_id, traceparent, value,"
        " 'MSG_SIZE_TOO_LARGE', created_at FROM moved",
        str(user),
    )
    shown = container.access_show(user)
    assert shown.verdict is Verdict.DRIFTED
    assert shown.state.waiting == ()
    assert [(e.change_reason, e.error) for e in shown.state.dead_letters] == [
        ("RoleRevoked", "MSG_SIZE_TOO_LARGE")
    ]


def test_an_unknown_user_is_not_found_without_reading_the_topic(container: Container) -> None:
    with pytest.raises(NotFoundError, match="does not exist"):
        container.access_show(uuid.uuid4())


def _produce(broker: str, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
    producer = Producer(producer_config({"bootstrap.servers": broker}))
    for key, value in records:
        producer.produce(ACCESS_TOPIC, value=value, key=key, partition=partition)
    assert producer.flush(30) == 0


def _event(user: UUID, assignments: list[dict[str, object]], version: int) -> bytes:
    payload = {"userId": str(user), "changeReason": "RoleAssigned", "version": version}
    body = {"eventId": str(uuid.uuid4()), "payload": {**payload, "activeAssignments": assignments}}
    return json.dumps(body).encode()


def _fillers(count: int) -> list[tuple[bytes, bytes | None]]:
    return [(str(uuid.uuid4()).encode(), _event(uuid.uuid4(), [], 1)) for _ in range(count)]


def test_the_last_event_is_found_windows_back_and_the_newest_of_the_user_wins(
    container: Container, broker: str
) -> None:
    user, _, _ = _granted_user(container)
    truth = container.access_show(user).state.active_assignments
    key = str(user).encode()
    partition = key_partition(key, 3)
    # Older to newer: a stale event of the user, a few others, the user's true one, then 3,000 others.
    _produce(
        broker,
        partition,
        [(key, _event(user, [], 7)), *_fillers(5), (key, _event(user, truth, 8)), *_fillers(3000)],
    )
    log = KafkaUserAccessLog({"bootstrap.servers": broker}, first_window=100)
    shown = show_access(log, PostgresAccessTruth(container.database), user)
    assert shown.verdict is Verdict.MATCHING
    assert shown.search.last_event is not None and shown.search.last_event.version == 8
    # Windows of 100, 200, 400, 800, 1,600, 3,200 from the end: the event is in the sixth, not at the start.
    assert 3000 < shown.search.records_read < 2 * 3000 + 100 * 2

    _produce(broker, partition, [(key, None)])  # a tombstone: the user's events are to be forgotten
    assert show_access(log, PostgresAccessTruth(container.database), user).verdict is Verdict.MISSING

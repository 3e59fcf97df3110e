"""`access show` on the real database and broker: users made matching, pending, drifted and missing by the
real use cases (and by SQL behind the service's back), and a last event found far from its partition's end."""

from __future__ import annotations

import json
import uuid
from typing import Any
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
from pin_identity.composition.connections import Connections
from pin_identity.composition.stores import Stores
from pin_identity.domain.access_verdicts import AssignmentDifferenceView, Verdict
from pin_identity.domain.errors import NotFoundError
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.operations import identity_changes
from pin_identity.operations.access_show import show_access
from pin_identity.operations.context import Context
from pin_identity.operations.documents import UserAccessReport
from tests.support import seed
from tests.support.relay import publish_outbox


def _rendered(shown: UserAccessReport) -> list[dict[str, Any]]:
    """The Active assignments as the event renders them."""
    return [assignment.model_dump() for assignment in shown.active_assignments]


def _difference(
    only_in_database: list[str] | None = None,
    only_on_topic: list[str] | None = None,
    changed: list[str] | None = None,
) -> AssignmentDifferenceView:
    return AssignmentDifferenceView(
        only_in_database=only_in_database or [], only_on_topic=only_on_topic or [], changed=changed or []
    )


def _sql(database_url: str, statement: str, *params: object) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(statement, params)


def _granted_user(container: Container) -> tuple[UUID, UUID, UUID]:
    """A user holding one role, its RoleAssigned published: (user, role, assignment)."""
    company = seed.company(container.stores.identity_transactions)
    role = seed.role(container.stores.identity_transactions, company)
    user = seed.user(container.stores.identity_transactions, company)
    assignment = seed.grant(container.stores.identity_transactions, user, role, company)
    publish_outbox(container)
    return user, role, assignment


def test_a_published_grant_is_matching_and_names_its_event(container: Container) -> None:
    user, role, assignment = _granted_user(container)
    shown = container.use_cases.access_show(user)
    assert shown.verdict is Verdict.MATCHING
    assert [a.assignment_id for a in shown.active_assignments] == [str(assignment)]
    event = shown.last_event
    assert event is not None
    assert (event.change_reason, event.version, event.changed_role_id) == ("RoleAssigned", 1, str(role))
    assert event.active_assignments == _rendered(shown)
    assert event.partition == shown.partition
    assert shown.partition == key_partition(str(user).encode(), 3)  # the session broker's 3
    assert shown.outbox == [] and shown.difference == _difference()


def test_a_change_still_in_the_outbox_is_pending(container: Container, stores: Stores) -> None:
    user, _, assignment = _granted_user(container)
    identity_changes.revoke_role_assignment(
        stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), assignment
    )
    shown = container.use_cases.access_show(user)
    assert shown.verdict is Verdict.PENDING
    assert [(e.change_reason, e.version) for e in shown.outbox] == [("RoleRevoked", 2)]
    assert shown.difference.only_on_topic == [str(assignment)]  # until the relay publishes the revoke

    publish_outbox(container)
    after = container.use_cases.access_show(user)
    assert after.verdict is Verdict.MATCHING
    assert after.last_event is not None and after.last_event.change_reason == "RoleRevoked"
    assert after.active_assignments == [] and after.last_event.active_assignments == []


def test_a_revoke_behind_the_services_back_is_drift_the_topic_still_grants(
    container: Container, database_url: str
) -> None:
    user, _, assignment = _granted_user(container)
    _sql(
        database_url,
        "UPDATE identity.role_assignments SET status = 'Revoked' WHERE id = %s",
        assignment,
    )
    shown = container.use_cases.access_show(user)
    assert shown.verdict is Verdict.DRIFTED
    assert shown.difference == _difference(only_on_topic=[str(assignment)])


def test_a_changed_scope_behind_the_services_back_is_drift_of_that_assignment(
    container: Container, database_url: str
) -> None:
    user, _, assignment = _granted_user(container)
    _sql(
        database_url,
        "UPDATE identity.role_assignments SET expires_at = now() + interval '1 day' WHERE id = %s",
        assignment,
    )
    shown = container.use_cases.access_show(user)
    assert shown.verdict is Verdict.DRIFTED
    assert shown.difference == _difference(changed=[str(assignment)])


def test_an_assignment_without_any_event_is_missing(
    container: Container, stores: Stores, database_url: str, broker: str
) -> None:
    company = seed.company(stores.identity_transactions)
    role = seed.role(stores.identity_transactions, company)
    user = seed.user(stores.identity_transactions, company)
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
    shown = container.use_cases.access_show(user)
    assert shown.verdict is Verdict.MISSING
    assert shown.last_event is None and shown.records_read > 0
    assert shown.difference == _difference(only_in_database=[str(granted)])


def test_a_user_with_no_assignment_and_no_event_has_nothing_to_carry(
    container: Container, stores: Stores
) -> None:
    user = seed.user(stores.identity_transactions, seed.company(stores.identity_transactions))
    publish_outbox(container)
    shown = container.use_cases.access_show(user)
    assert (shown.verdict, shown.last_event, shown.active_assignments) == (
        Verdict.MATCHING,
        None,
        [],
    )


def test_a_dead_lettered_access_event_is_shown_beside_the_drift_it_leaves(
    container: Container, stores: Stores, database_url: str
) -> None:
    user, _, assignment = _granted_user(container)
    identity_changes.revoke_role_assignment(
        stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), assignment
    )
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
    shown = container.use_cases.access_show(user)
    assert shown.verdict is Verdict.DRIFTED
    assert shown.outbox == []
    assert [(e.change_reason, e.error) for e in shown.dead_letters] == [("RoleRevoked", "MSG_SIZE_TOO_LARGE")]


def test_an_unknown_user_is_not_found_without_reading_the_topic(container: Container) -> None:
    with pytest.raises(NotFoundError, match="does not exist"):
        container.use_cases.access_show(uuid.uuid4())


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
    container: Container, connections: Connections, broker: str
) -> None:
    user, _, _ = _granted_user(container)
    truth = _rendered(container.use_cases.access_show(user))
    key = str(user).encode()
    partition = key_partition(key, 3)
    # Older to newer: a stale event of the user, a few others, the user's true one, then 3,000 others.
    _produce(
        broker,
        partition,
        [(key, _event(user, [], 7)), *_fillers(5), (key, _event(user, truth, 8)), *_fillers(3000)],
    )
    log = KafkaUserAccessLog({"bootstrap.servers": broker}, first_window=100)
    shown = show_access(log, PostgresAccessTruth(connections.database), user)
    assert shown.verdict is Verdict.MATCHING
    assert shown.last_event is not None and shown.last_event.version == 8
    # Windows of 100, 200, 400, 800, 1,600, 3,200 from the end: the event is in the sixth, not at the start.
    assert 3000 < shown.records_read < 2 * 3000 + 100 * 2

    _produce(broker, partition, [(key, None)])  # a tombstone: the user's events are to be forgotten
    assert show_access(log, PostgresAccessTruth(connections.database), user).verdict is Verdict.MISSING

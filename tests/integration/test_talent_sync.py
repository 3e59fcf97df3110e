"""The continuous consumer on the real broker and database: snapshots in, replica rows and events out."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from confluent_kafka import Producer, TopicPartition

from pin_identity.composition import Container
from pin_identity.composition.connections import Connections
from pin_identity.operations.ports.talent_sources import TalentRecord
from pin_identity.simulation.simulated_talent import TalentDataset
from tests.support import talent
from tests.support.clocks import ManualClock
from tests.support.kafka_tap import EventTap
from tests.support.relay import publish_outbox
from tests.support.schemas import validate_event
from tests.support.talent import TalentTopics
from tests.support.waiting import first_answer, wait_until


def _rows(container: Container, sql: Any) -> list[tuple[Any, ...]]:
    with container.connections.database.connection() as conn:
        return conn.execute(sql).fetchall()


def _replica(container: Container) -> list[tuple[Any, ...]]:
    return _rows(
        container,
        "SELECT u.external_talent_user_id, u.status, u.phone, u.first_name, u.replica_version,"
        " c.external_talent_tenant_id, c.status, c.replica_version,"
        " (SELECT count(*) FROM identity.role_assignments ra"
        "  WHERE ra.user_id = u.id AND ra.status = 'Active')"
        " FROM identity.users u JOIN identity.companies c ON c.id = u.company_id ORDER BY 1",
    )


def test_snapshots_on_the_topics_reach_the_replica_and_the_identity_topics(
    container: Container, talent_topics: TalentTopics, tap: EventTap
) -> None:
    company = talent.tenant()
    managers = [talent.user(company["tenantId"]) for _ in range(3)]
    renamed = {**managers[0], "version": 2, "firstName": "Пётр"}
    talent.produce(container, talent_topics, TalentDataset([company], [*managers, renamed]))

    talent.run_until_caught_up(talent.sync_job(container, talent_topics))
    publish_outbox(container)

    replica = _replica(container)
    assert [(str(r[0]), r[1], r[4], r[6], r[8]) for r in replica] == sorted(
        [(m["userId"], "Invited", 2 if m is managers[0] else 1, "Active", 1) for m in managers]
    )
    user_ids = {str(u) for (u,) in _rows(container, "SELECT id FROM identity.users")}
    events = tap.wait_for(lambda e: e.body["aggregateId"] in user_ids, count=3 + 1 + 3)
    kinds = sorted(e.body["eventType"] for e in events)
    assert kinds == ["UserAccessChanged"] * 3 + ["UserUpserted"] * 4
    for event in events:
        validate_event(event.body)


class _DiesBeforeOffsetCommit:
    """A stream whose process dies after the database commit and before the offset commit."""

    def __init__(self, inner: talent.KafkaTalentStream):
        self._inner = inner

    def poll(self, max_records: int, timeout_s: float) -> list[TalentRecord]:
        return self._inner.poll(max_records, timeout_s)

    def commit(self, records: Sequence[TalentRecord]) -> None:
        return None  # never reached the broker

    def rewind(self, records: Sequence[TalentRecord]) -> None:
        self._inner.rewind(records)

    def recommit(self) -> int | None:
        return None  # dead before it could

    def lag(self) -> dict[tuple[str, int], int] | None:
        return self._inner.lag()

    def unapplied_since(self, behind: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], datetime]:
        return self._inner.unapplied_since(behind)

    def positions(self) -> dict[tuple[str, int], tuple[int, int]]:
        return self._inner.positions()

    def close(self) -> None:
        self._inner.close()


def test_a_consumer_killed_between_database_and_offset_commit_replays_safely(
    container: Container, talent_topics: TalentTopics
) -> None:
    company = talent.tenant()
    managers = [talent.user(company["tenantId"]) for _ in range(5)]
    talent.produce(container, talent_topics, TalentDataset([company], managers))
    dying = _DiesBeforeOffsetCommit(talent.talent_stream(container, talent_topics))
    stop = threading.Event()
    first = threading.Thread(target=talent.sync_job(container, talent_topics, stream=dying).run, args=(stop,))
    first.start()
    # Every snapshot applied, no offset committed (the group's lag says so): then the process dies.
    wait_until(lambda: len(_replica(container)) == 5, "the batch is committed in the database")
    stop.set()
    first.join(30)
    before = (_replica(container), _rows(container, "SELECT count(*) FROM identity.outbox_events"))

    talent.run_until_caught_up(talent.sync_job(container, talent_topics))

    assert (_replica(container), _rows(container, "SELECT count(*) FROM identity.outbox_events")) == before
    assert before[1] == [(1 + 5 * 2,)]


def test_a_user_before_its_tenant_is_retried_with_backoff_and_when_the_tenant_arrives(
    container: Container, talent_topics: TalentTopics
) -> None:
    """Retried 1 s after its first deferral and 2 s after its second (retry_base_s = 1, doubling), and at
    once when its tenant arrives: a run with `--once` that sees the user before its tenant ends with both."""
    clock = ManualClock()
    company = talent.tenant()
    manager = talent.user(company["tenantId"])
    talent.produce(container, talent_topics, TalentDataset([], [manager]))
    talent.run_until_caught_up(talent.sync_job(container, talent_topics, clock=clock))
    assert _deferral(container) == ("IDENTITY_SYNC_COMPANY_NOT_FOUND", 1, clock.now() + timedelta(seconds=1))

    clock.advance(1)
    talent.run_until_caught_up(talent.sync_job(container, talent_topics, clock=clock))
    assert _deferral(container) == ("IDENTITY_SYNC_COMPANY_NOT_FOUND", 2, clock.now() + timedelta(seconds=2))

    job = talent.sync_job(container, talent_topics, clock=clock)
    talent.produce(container, talent_topics, TalentDataset([company], []))
    talent.run_until_caught_up(
        job
    )  # the clock stands still: the tenant's arrival, not the back-off, frees it

    assert [str(r[0]) for r in _replica(container)] == [manager["userId"]]
    assert _rows(container, "SELECT count(*) FROM identity.talent_import_failed_items") == [(0,)]


def test_a_deletion_after_a_user_deferred_for_its_tenant_waits_and_the_user_ends_blocked(
    container: Container, talent_topics: TalentTopics
) -> None:
    """The user's snapshot (version 1) comes before its tenant, its deletion (version 2) after it: in
    version order the user is created, then blocked, as an import of the same snapshots leaves it."""
    clock = ManualClock()
    company = talent.tenant()
    manager = talent.user(company["tenantId"])
    deleted = {**manager, "version": 2, "isDeleted": True}
    talent.produce(container, talent_topics, TalentDataset([], [manager, deleted]))
    talent.run_until_caught_up(talent.sync_job(container, talent_topics, clock=clock))
    waiting = (
        "SELECT error_code, (payload->>'version')::int FROM identity.talent_import_failed_items ORDER BY 2"
    )
    assert _rows(container, waiting) == [
        ("IDENTITY_SYNC_COMPANY_NOT_FOUND", 1),
        ("IDENTITY_SYNC_COMPANY_NOT_FOUND", 2),
    ]

    talent.produce(container, talent_topics, TalentDataset([company], []))
    talent.run_until_caught_up(talent.sync_job(container, talent_topics, clock=clock))
    clock.advance(1)
    talent.run_until_caught_up(talent.sync_job(container, talent_topics, clock=clock))

    assert [(str(r[0]), r[1], r[4]) for r in _replica(container)] == [(manager["userId"], "Blocked", 2)]
    assert _rows(container, waiting) == []


def test_deferred_snapshots_retried_together_publish_only_the_newest(
    container: Container, talent_topics: TalentTopics
) -> None:
    """Talent's users topic holds each user at V, then V+5, then a late duplicate of V+1 (Talent's retries),
    all before their tenant. Had they come after it, the guard would have kept V+5 over the late V+1: no
    event may carry V+1, which Talent had replaced. Only the newest is applied and announced."""
    clock = ManualClock()
    company = talent.tenant()
    managers = [talent.user(company["tenantId"], version=3) for _ in range(5)]
    arrivals = [
        {**manager, "version": version, "firstName": f"v{version}"}
        for manager in managers
        for version in (3, 8, 4)
    ]
    talent.produce(container, talent_topics, TalentDataset([], arrivals))
    talent.run_until_caught_up(talent.sync_job(container, talent_topics, clock=clock))
    talent.produce(container, talent_topics, TalentDataset([company], []))
    talent.run_until_caught_up(talent.sync_job(container, talent_topics, clock=clock))
    clock.advance(60)  # past any back-off: whatever still waited is tried
    talent.run_until_caught_up(talent.sync_job(container, talent_topics, clock=clock))

    upserted = [e["payload"] for e in talent.outbox_events(container) if e["eventType"] == "UserUpserted"]
    assert sorted(
        (u["externalTalentUserId"], u["replicaVersion"], u["firstName"]) for u in upserted
    ) == sorted((m["userId"], 8, "v8") for m in managers)
    assert {(str(r[0]), r[4], r[3]) for r in _replica(container)} == {
        (m["userId"], 8, "v8") for m in managers
    }
    assert _rows(container, "SELECT count(*) FROM identity.talent_import_failed_items") == [(0,)]


def _produce_in_transactions(container: Container, topics: TalentTopics, dataset: TalentDataset) -> None:
    """As a Talent that produces transactionally: each topic's records in a transaction of their own, whose
    commit marker is the last offset of every partition it wrote."""
    producer = Producer(
        {**container.connections.kafka_client_config, "transactional.id": f"talent-{uuid.uuid4()}"}
    )
    producer.init_transactions(30)
    batches = ((topics.tenants, dataset.tenants, "tenantId"), (topics.users, dataset.users, "userId"))
    for topic, snapshots, key in batches:
        producer.begin_transaction()
        for snapshot in snapshots:
            producer.produce(topic, json.dumps(snapshot).encode(), snapshot[key].encode())
        producer.commit_transaction(30)


def test_lag_reaches_zero_when_talent_produces_transactionally_and_once_ends(
    container: Container, talent_topics: TalentTopics
) -> None:
    """Past the last record of each partition lies its transaction's commit marker, which no consumer
    reads: the lag counts to the partition's end, so the consumer commits it once read to there."""
    company = talent.tenant()
    managers = [talent.user(company["tenantId"]) for _ in range(6)]
    _produce_in_transactions(container, talent_topics, TalentDataset([company], managers))
    stop, ended = threading.Event(), threading.Event()
    job = talent.sync_job(container, talent_topics)
    runner = threading.Thread(target=lambda: (job.run(stop, once=True), ended.set()), daemon=True)

    runner.start()
    try:
        assert ended.wait(60), "talent-sync --once never ended: the lag stayed above 0"
    finally:
        stop.set()
        runner.join(30)

    assert len(_replica(container)) == 6


def _deferral(container: Container) -> tuple[str, int, datetime]:
    [row] = _rows(
        container,
        "SELECT error_code, attempt_count, next_attempt_at FROM identity.talent_import_failed_items",
    )
    return row


def test_poison_records_on_the_topic_are_quarantined_and_the_partition_moves_on(
    container: Container, connections: Connections, talent_topics: TalentTopics
) -> None:
    """Bytes a producer could write that once crashed the worker or failed its batch again and again."""
    good = [talent.tenant() for _ in range(2)]
    poison = {
        str(uuid.uuid4()): b'{"tenantId": "%s", "version": NaN}',
        str(uuid.uuid4()): b'{"tenantId": "%s", "deep": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        str(uuid.uuid4()): b'{"tenantId": "%s", "version": ' + b"7" * 5000 + b"}",
        str(uuid.uuid4()): b'{"tenantId": "%s", "version": 1, "name": "\\ud800", "companyType": "Bank"}',
        str(uuid.uuid4()): b"\xff\xfe not text",
    }
    producer = Producer(connections.kafka_client_config)
    producer.produce(talent_topics.tenants, json.dumps(good[0]).encode(), good[0]["tenantId"])
    for key, value in poison.items():
        producer.produce(talent_topics.tenants, value.replace(b"%s", key.encode()), key)
    producer.produce(talent_topics.tenants, json.dumps(good[1]).encode(), good[1]["tenantId"])
    assert producer.flush(30) == 0

    talent.run_until_caught_up(talent.sync_job(container, talent_topics))  # returns: nothing crashed

    applied = {
        str(t) for (t,) in _rows(container, "SELECT external_talent_tenant_id FROM identity.companies")
    }
    assert applied == {t["tenantId"] for t in good}
    quarantined = dict(
        _rows(container, "SELECT external_id::text, error_code FROM identity.talent_import_failed_items")
    )
    assert quarantined == dict.fromkeys(poison, "IDENTITY_SYNC_INVALID_PAYLOAD")


def test_offsets_a_commit_lost_are_committed_again_by_the_stream(
    container: Container, talent_topics: TalentTopics
) -> None:
    company = talent.tenant()
    talent.produce(container, talent_topics, TalentDataset([company], [talent.user(company["tenantId"])]))
    stream = talent.talent_stream(container, talent_topics)
    try:
        records: list[TalentRecord] = []

        def both_read() -> bool:
            records.extend(stream.poll(10, 0.5))
            return len(records) == 2

        wait_until(both_read, "both records are read")
        assert stream.recommit() is None  # nothing applied yet: nothing to ask
        stream.commit(records)
        assert stream.recommit() == 0  # the group has what was applied
        # What a commit lost while the coordinator moved leaves: the group's offsets behind what was applied.
        stream._consumer.commit(  # the loss itself cannot be had on one broker
            offsets=[TopicPartition(r.topic, r.partition, r.offset) for r in records], asynchronous=False
        )
        # None until a fetch answered for every assigned partition (the two records came from two of them).
        assert sum(first_answer(stream.lag, "every partition's end is known").values()) == 2

        assert stream.recommit() == 2
        assert sum(first_answer(stream.lag, "every partition's end is known").values()) == 0
    finally:
        stream.close()

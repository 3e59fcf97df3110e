"""Every row of the ACL table is needed, and a job without one says so and loses nothing: for each row, the
job runs on a principal holding all its rows but that one, says in one line (`kafka-access-denied`) which
operation on which resource the broker denied, keeps what it had not done (events wait in the outbox, no
offset is committed, a one-shot command fails with its documented error), and goes on once the row is
granted."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from structlog.testing import capture_logs

from pin_identity.adapters.kafka.acls import Grant, TalentNames, job_grants
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.adapters.postgres.outbox_writer import write_outbox
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.access_verdicts import Verdict
from pin_identity.domain.errors import BrokerUnavailableError
from pin_identity.domain.events import ACCESS_TOPIC, PUBLISHED_TOPICS, envelope
from pin_identity.domain.import_run import (
    ImportMode,
    ImportRequest,
    ImportSourceUnavailableError,
    RunStatus,
)
from pin_identity.operations.action_log import Actor
from tests.support import seed
from tests.support.relay import outbox_count, publish_outbox
from tests.support.secured_kafka import JobLogins, Principal, SecuredKafka, talent_topics_of_their_own
from tests.support.talent import TalentTopics, replica_state, sync_job
from tests.support.talent_import import run_to_end
from tests.support.waiting import wait_until

USERS = 12
# The rows as the table has them for any Talent names: the parameters, named after the row.
_ROWS = job_grants(TalentNames("talent-tenants", "talent-users", "talent-sync-group"))


@dataclass
class Case:
    row: Grant
    container: Container
    settings: Settings
    broker: SecuredKafka
    talent: TalentNames
    database_url: str
    logs: list[dict[str, Any]]
    principal: Principal

    def denied(self) -> list[dict[str, Any]]:
        return [line for line in self.logs if line["event"] == "kafka-access-denied"]

    def wait_denied(self) -> None:
        wait_until(lambda: bool(self.denied()), f"{self.row.job} says what the broker denied", timeout_s=30)

    def grant(self) -> None:
        self.broker.grant([self.row], self.principal)


@pytest.fixture(params=range(len(_ROWS)), ids=[str(row).replace(" ", "_") for row in _ROWS])
def case(
    request: pytest.FixtureRequest,
    settings: Settings,
    secured_broker: SecuredKafka,
    tmp_path: Path,
    database_url: str,
) -> Iterator[Case]:
    talent = talent_topics_of_their_own(secured_broker, USERS)
    row = job_grants(talent)[request.param]
    logins = JobLogins(secured_broker, tmp_path / "logins", talent)
    login, principal = logins.login(settings, row.job, without=row)
    ensure_topics(secured_broker.admin_config, PUBLISHED_TOPICS, TopicLayout(3, 1))
    container = Container(login)
    with capture_logs() as logs:
        built = Case(row, container, login, secured_broker, talent, database_url, logs, principal)
        yield built
    container.close()


def _said_the_row(case: Case) -> None:
    """One line naming an operation of the row, its resource and its name."""
    row = case.row
    said = [(line["operation"], line["resource"], str(line["name"])) for line in case.denied()]
    # Describe is what reading a topic's partitions and offsets takes; Read and Write grant it too.
    granted = {*row.operations, *(("Describe",) if {"Read", "Write"} & set(row.operations) else ())}
    assert any(
        operation in granted
        and resource == row.resource
        and (name.startswith(row.name) if row.prefixed else name == row.name)
        for operation, resource, name in said
    ), said
    assert all(str(line["message"]).startswith("Kafka denied ") for line in case.denied())


def test_a_job_without_one_acl_says_which_loses_nothing_and_goes_on_once_granted(case: Case) -> None:
    _FLOWS[case.row.job](case)


# ---------------------------------------------------------------- the jobs, one flow each


def _topic_admin(case: Case) -> None:
    admin = AdminClient(case.broker.admin_config)
    for future in admin.delete_topics([case.row.name], operation_timeout=30).values():
        future.result()
    wait_until(lambda: case.row.name not in admin.list_topics(timeout=5).topics, "the topic is gone")
    with pytest.raises(KafkaException, match="Kafka denied Create on topic"):
        case.container.connections.ensure_topics()
    _said_the_row(case)
    case.grant()
    assert case.row.name in case.container.connections.ensure_topics()


def _outbox_relay(case: Case) -> None:
    topic = case.row.name if case.row.resource == "topic" else ACCESS_TOPIC
    with psycopg.connect(case.database_url) as conn:
        write_outbox(conn, [_event(topic) for _ in range(5)])
    stop = threading.Event()
    relay = threading.Thread(target=case.container.jobs.outbox_relay().run, args=(stop,), daemon=True)
    relay.start()
    try:
        case.wait_denied()
        _said_the_row(case)
        assert relay.is_alive(), "the relay stays up"
        assert outbox_count(case.database_url) == 5, "the events wait in the outbox"
    finally:
        stop.set()
        relay.join(30)
    case.grant()
    again = Container(case.settings)  # a relay started again: the stopped one let go of its producer
    publish_outbox(again)
    again.close()
    assert (outbox_count(case.database_url), outbox_count(case.database_url, "outbox_dead_letters")) == (0, 0)


def _event(topic: str) -> Any:
    return envelope(
        event_type="UserAccessChanged",
        topic=topic,
        aggregate_type="User",
        aggregate_id=uuid.uuid4(),
        payload={"n": 1},
        correlation_id=uuid.uuid4(),
        occurred_at=datetime.now(UTC),
    )


def _talent_sync(case: Case) -> None:
    topics = TalentTopics(case.talent.tenants_topic, case.talent.users_topic, case.talent.sync_group)
    job = sync_job(case.container, topics)
    stop = threading.Event()
    consumer = threading.Thread(target=job.run, args=(stop,), daemon=True)
    consumer.start()
    try:
        case.wait_denied()
        _said_the_row(case)
        assert consumer.is_alive(), "talent-sync stays up"
        denied = [case.row.name] if case.row.resource == "topic" else None
        assert _committed(case, denied) == 0, "no offset is committed for what was not applied"
        case.grant()
        wait_until(
            lambda: len(replica_state(case.container)["users"]) == USERS,
            "talent-sync goes on once granted",
            timeout_s=60,
        )
    finally:
        stop.set()
        consumer.join(30)


_COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}


def _committed(case: Case, topics: list[str] | None = None) -> int:
    """Records of the Talent topics (or of `topics`) the group has committed past (read by the set-up's
    super user). A retriable answer (NOT_COORDINATOR while the group's coordinator moves or loads) is asked
    again."""
    reader = Consumer({**case.broker.admin_config, "group.id": case.talent.sync_group})
    partitions = [
        TopicPartition(topic, number)
        for topic in topics or (case.talent.tenants_topic, case.talent.users_topic)
        for number in range(3)
    ]
    answer: list[TopicPartition] = []

    def answered() -> bool:
        try:
            answer[:] = reader.committed(partitions, timeout=10)
        except KafkaException as exc:
            if exc.args[0].code() not in _COORDINATOR_MOVING and not exc.args[0].retriable():
                raise
            return False
        return True

    try:
        wait_until(answered, "the group's coordinator answers", timeout_s=30)
    finally:
        reader.close()
    return sum(max(tp.offset, 0) for tp in answer)


def _talent_import(case: Case) -> None:
    request = ImportRequest(ImportMode.TOPIC_REPLAY)
    if case.row.resource == "topic":
        with pytest.raises(ImportSourceUnavailableError, match="Kafka denied"):
            run_to_end(case.container, request)
    else:  # a group: the run goes on without it, saying so (a page retried, the handover skipped)
        assert run_to_end(case.container, request).status is RunStatus.COMPLETED
    _said_the_row(case)
    case.grant()
    run = run_to_end(case.container, request)
    assert run.status is RunStatus.COMPLETED
    assert len(replica_state(case.container)["users"]) == USERS
    if case.row.name == case.talent.sync_group:
        assert _committed(case) > 0, "the import hands talent-sync's group over once it may"


def _access_reader(case: Case) -> None:
    user = _user_with_an_event(case)
    failure = BrokerUnavailableError
    if case.row.resource == "topic":
        with pytest.raises(failure, match="Kafka denied"):
            case.container.use_cases.access_audit(lambda done, total: None)
    with pytest.raises(failure, match="Kafka denied"):
        case.container.use_cases.access_show(user)
    _said_the_row(case)
    case.grant()
    assert case.container.use_cases.access_show(user).verdict is Verdict.MATCHING
    # The topic holds other tests' users too (the broker is shared): the audit reads it whole.
    assert case.container.use_cases.access_audit(lambda done, total: None).incomplete_partitions == []


def _user_with_an_event(case: Case) -> uuid.UUID:
    """A user whose access event is on the topic (written and published by the set-up's super user)."""
    super_user = {
        "kafka_config_file": None,
        "kafka_bootstrap_servers": case.broker.admin_config["bootstrap.servers"],
    }
    writer = Container(case.settings.model_copy(update=super_user))
    company = seed.company(writer.stores.identity_transactions)
    role = seed.role(writer.stores.identity_transactions, company)
    user = seed.user(writer.stores.identity_transactions, company)
    seed.grant(writer.stores.identity_transactions, user, role, company)
    publish_outbox(writer)
    writer.close()
    return user


def _serve(case: Case) -> None:
    row = case.row
    if row.resource == "group" and row.name == case.talent.sync_group:
        lag = case.container.use_cases.health.consumer_lag()
        assert lag.error is not None and lag.error.startswith("Kafka denied"), lag
    elif row.resource == "topic" and row.name != ACCESS_TOPIC:
        with pytest.raises(ImportSourceUnavailableError, match="Kafka denied"):
            case.container.use_cases.imports.start(
                ImportRequest(ImportMode.TOPIC_REPLAY), who=Actor("http:olga")
            )
    else:
        with pytest.raises(BrokerUnavailableError, match="Kafka denied"):
            case.container.use_cases.access_show(_user_with_an_event(case))
    _said_the_row(case)
    case.grant()
    assert case.container.use_cases.health.consumer_lag().error is None
    assert case.container.use_cases.access_show(_user_with_an_event(case)).last_event is not None
    run = case.container.use_cases.imports.start(
        ImportRequest(ImportMode.TOPIC_REPLAY), who=Actor("http:olga")
    )
    assert run.status is RunStatus.RUNNING


_FLOWS: dict[str, Callable[[Case], None]] = {
    "topic-admin": _topic_admin,
    "outbox-relay": _outbox_relay,
    "talent-sync": _talent_sync,
    "talent-import": _talent_import,
    "access-reader": _access_reader,
    "serve": _serve,
}

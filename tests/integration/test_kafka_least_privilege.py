"""Each job on a principal of its own holding exactly its rows of the ACL table (`adapters/kafka/acls.py`, the
table deploy/README.md shows), on a broker that allows nothing else (SASL_SSL, SCRAM-SHA-512, the
StandardAuthorizer): the topics created by the topic admin, a fan-out published by the relay and audited,
`access show`, a talent-sync, a TopicReplay import, and the admin API's Kafka reads. Each job reads its
password from a file named by its PIN_IDENTITY_KAFKA_CONFIG_FILE."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from pin_identity.adapters.kafka.acls import JOBS, TalentNames
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.access_verdicts import Verdict
from pin_identity.domain.events import ACCESS_TOPIC, PUBLISHED_TOPICS
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.import_run import ImportMode, ImportRequest, RunStatus
from pin_identity.operations.action_log import Actor
from tests.support import seed
from tests.support.relay import publish_outbox
from tests.support.secured_kafka import JobLogins, SecuredKafka, talent_topics_of_their_own
from tests.support.talent import TalentTopics, replica_state, sync_job
from tests.support.talent_import import run_to_end
from tests.support.waiting import wait_until

USERS = 40


@pytest.fixture
def logins(secured_broker: SecuredKafka, tmp_path: Path) -> JobLogins:
    return JobLogins(secured_broker, tmp_path / "logins", talent_topics_of_their_own(secured_broker, USERS))


@pytest.fixture
def containers(settings: Settings, logins: JobLogins) -> Iterator[dict[str, Container]]:
    built = {job: Container(logins.login(settings, job)[0]) for job in JOBS}
    yield built
    for container in built.values():
        container.close()


def test_the_topic_admin_creates_the_topics_the_relay_publishes_and_the_reader_audits_and_shows(
    containers: dict[str, Container],
) -> None:
    containers[
        "topic-admin"
    ].connections.ensure_topics()  # created here, or by an earlier test of this broker
    writer = containers["outbox-relay"]
    company = seed.company(writer.stores.identity_transactions)
    role = seed.role(writer.stores.identity_transactions, company)
    users = [seed.user(writer.stores.identity_transactions, company) for _ in range(USERS)]
    for user in users:
        seed.grant(writer.stores.identity_transactions, user, role, company)
    seed.change_permissions(
        writer.stores.identity_transactions, role, ["deals.read"], FanOutPolicy(inline_threshold=USERS)
    )
    publish_outbox(writer)
    report = containers["access-reader"].use_cases.access_audit(lambda done, total: None)
    # The broker is shared: users of other tests' databases may show as drifted here, never ours.
    assert (report.missing, report.pending, report.incomplete_partitions) == (0, 0, [])
    assert report.users >= USERS and not {str(user) for user in users} & set(report.examples)
    shown = containers["access-reader"].use_cases.access_show(users[0])
    assert shown.verdict is Verdict.MATCHING
    assert containers["serve"].use_cases.access_show(users[-1]).verdict is Verdict.MATCHING


def test_talent_sync_consumes_and_commits_on_its_principal(
    containers: dict[str, Container], logins: JobLogins
) -> None:
    job = sync_job(containers["talent-sync"], _topics(logins.talent))
    stop = threading.Event()
    consumer = threading.Thread(target=job.run, args=(stop,), daemon=True)
    consumer.start()
    try:  # until every user is in: one read before its tenant waits for its retry (1 s), not for a next run
        wait_until(lambda: len(replica_state(containers["talent-sync"])["users"]) == USERS, "all users in")
    finally:
        stop.set()
        consumer.join(30)
    lag = containers["serve"].use_cases.health.consumer_lag()
    assert lag.error is None and lag.total == 0, lag


def test_a_topic_replay_import_started_by_the_admin_api_runs_and_hands_the_group_over_on_its_principal(
    containers: dict[str, Container],
) -> None:
    request = ImportRequest(ImportMode.TOPIC_REPLAY)
    started = containers["serve"].use_cases.imports.start(request, who=Actor("http:olga"))
    run = run_to_end(containers["talent-import"], request)  # what a worker's talent-import does with it
    assert run.run_id == started.run_id
    assert run.status is RunStatus.COMPLETED
    assert run.users.applied == USERS
    lag = containers["serve"].use_cases.health.consumer_lag()
    assert lag.error is None and lag.total == 0, lag  # the import moved talent-sync's group to its end


def _topics(talent: TalentNames) -> TalentTopics:
    return TalentTopics(talent.tenants_topic, talent.users_topic, talent.sync_group)


def test_no_job_principal_may_do_what_it_was_not_granted(containers: dict[str, Container]) -> None:
    """The broker refuses what no ACL allows: the reader may not create a topic, talent-sync may not
    publish."""
    stray = f"{PUBLISHED_TOPICS[0]}.stray-{uuid.uuid4().hex[:6]}"
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        ensure_topics(containers["access-reader"].connections.kafka_client_config, [stray], TopicLayout(1, 1))
    refused: list[KafkaError | None] = []
    producer = Producer(containers["talent-sync"].connections.kafka_client_config)
    producer.produce(ACCESS_TOPIC, b"{}", key=b"k", on_delivery=lambda error, _: refused.append(error))
    producer.flush(15)
    assert [error.code() if error else None for error in refused] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

"""Session-wide real servers: an embedded PostgreSQL (a fresh database per test, copied from a migrated
template) and an embedded Apache Kafka broker (a broker of its own where a test reads a whole topic, stops,
kills or stalls it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest

from pin_identity.adapters.kafka.embedded_kafka import JVM_OPTIONS_VARIABLE, start_broker, stop_broker
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.adapters.postgres.embedded_postgres import ensure_embedded_postgres, stop_embedded_postgres
from pin_identity.composition import Container
from pin_identity.composition.connections import Connections
from pin_identity.composition.stores import Stores
from pin_identity.config import FanOutSettings, Settings
from pin_identity.domain.events import PUBLISHED_TOPICS
from pin_identity.domain.import_run import ImportMode
from pin_identity.simulation.simulated_talent import SimulatedTalentApi, TalentDataset, create_talent_topics
from tests.support import brokers, session_dirs
from tests.support.brokers import ProxiedBroker, start_transaction_coordinator
from tests.support.cli import unconfigured_environment
from tests.support.cluster import KafkaCluster, kafka_cluster
from tests.support.databases import create_template, scratch_database
from tests.support.kafka_tap import EventTap
from tests.support.secured_kafka import SecuredKafka, secured_kafka
from tests.support.talent import TalentTopics
from tests.support.talent_import import TalentWorld

# The suite's brokers live seconds to minutes: compiled by C1 alone, they cost a fifth less CPU (a cluster
# test: 216 s of CPU before, 172 s after), which the other pytest process gets (BENCHMARKS.md, "Test suite").
os.environ.setdefault(JVM_OPTIONS_VARIABLE, "-XX:TieredStopAtLevel=1")

# Tests that load the machine most (three-node clusters, a 200,000-user fan-out) or that time how fast a
# command fails: with `pytest -n 3 --dist loadgroup` they run one after another in one process, so a command's
# 15 s bound never measures a cluster's load on another process.
ONE_AT_A_TIME = pytest.mark.xdist_group("brokers-one-at-a-time")
_ONE_AT_A_TIME_FILES = {"test_broker_crash.py", "test_error_surface.py"}


@pytest.hookimpl(tryfirst=True)  # before pytest's own temporary-directory plugin reads the option
def pytest_configure(config: pytest.Config) -> None:
    """The session's temporary files outside `pytest-of-<user>`, which any other session resets to 0700
    (tests/support/session_dirs.py); the workers of `pytest -n` take their part of the controller's."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = str(session_dirs.new_basetemp())


# tryfirst: pytest-xdist tags a grouped test in its own hook of this name, which must see the mark.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long fault and load tests first: spread over the processes of `pytest -n`, they start at once
    instead of one of them running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()) or item.path.name in _ONE_AT_A_TIME_FILES:
            item.add_marker(ONE_AT_A_TIME)


@pytest.fixture(scope="session")
def postgres_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("pg")
    url = ensure_embedded_postgres(data_dir, database="postgres")
    with psycopg.connect(url, autocommit=True) as conn:
        # Durability is not what tests measure; these make a per-test database cheap.
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("ALTER SYSTEM SET synchronous_commit = off")
        conn.execute("ALTER SYSTEM SET full_page_writes = off")
        conn.execute("SELECT pg_reload_conf()")
    create_template(url)
    yield url
    stop_embedded_postgres(data_dir)


@pytest.fixture
def database_url(postgres_admin_url: str) -> Iterator[str]:
    with scratch_database(postgres_admin_url) as url:
        yield url


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process = start_broker(tmp_path_factory.mktemp("kafka"))
    ensure_topics({"bootstrap.servers": process.bootstrap_servers}, PUBLISHED_TOPICS, TopicLayout(3, 1))
    start_transaction_coordinator(process.bootstrap_servers)
    yield process.bootstrap_servers
    stop_broker(process.pid)


@pytest.fixture(scope="session")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    """The least-privilege tests' broker: SASL_SSL, SCRAM, ACLs only; each test has principals of its own."""
    with secured_kafka(tmp_path_factory.mktemp("secured-kafka")) as started:
        yield started


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[str]:
    """A broker of the test's own, for what reads a whole topic (the audit, the demo)."""
    process = start_broker(tmp_path / "own-broker")
    start_transaction_coordinator(process.bootstrap_servers)
    yield process.bootstrap_servers
    stop_broker(process.pid)


@pytest.fixture
def proxied_broker(tmp_path: Path) -> Iterator[ProxiedBroker]:
    """A broker of the test's own behind a proxy that the test stalls and restores, and may restart."""
    with brokers.proxied_broker(tmp_path / "broker") as started:
        yield started


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    """A three-node cluster of the test's own (three replicas, two in sync), its nodes the test's to stop,
    kill and start."""
    with kafka_cluster(tmp_path / "cluster") as started:
        yield started


@pytest.fixture
def cluster_env(subprocess_env: dict[str, str], cluster: KafkaCluster) -> dict[str, str]:
    """A subprocess's environment on the test's three-node cluster, its topics on three replicas."""
    return {
        **subprocess_env,
        "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap,
        "PIN_IDENTITY_KAFKA_REPLICATION_FACTOR": "3",
    }


@pytest.fixture
def settings(database_url: str, broker: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database_url,
        kafka_bootstrap_servers=broker,
        data_dir=tmp_path,
        worker_http_port=0,
        kafka_topic_partitions=3,
        kafka_replication_factor=1,
        fanout=FanOutSettings(polling_interval_s=0.5),
    )


@pytest.fixture
def container(settings: Settings) -> Iterator[Container]:
    built = Container(settings)
    yield built
    built.close()


# A test asks for the part it uses; the parts are the container's own, so one test holds one pool.
@pytest.fixture
def connections(container: Container) -> Connections:
    return container.connections


@pytest.fixture
def stores(container: Container) -> Stores:
    return container.stores


@pytest.fixture
def tap(broker: str) -> Iterator[EventTap]:
    opened = EventTap(broker, PUBLISHED_TOPICS)
    yield opened
    opened.close()


@pytest.fixture
def subprocess_env(settings: Settings) -> dict[str, str]:
    """The environment for running `pin-identity` as a subprocess against the test servers."""
    env = unconfigured_environment()
    env.update(
        {
            "PIN_IDENTITY_DATABASE_URL": str(settings.database_url),
            "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": str(settings.kafka_bootstrap_servers),
            "PIN_IDENTITY_DATA_DIR": str(settings.data_dir),
            "PIN_IDENTITY_WORKER_HTTP_PORT": "0",
            "PIN_IDENTITY_KAFKA_TOPIC_PARTITIONS": "3",
            "PIN_IDENTITY_KAFKA_REPLICATION_FACTOR": "1",
            "PIN_IDENTITY_LOG_FORMAT": "json",
        }
    )
    return env


@pytest.fixture
def talent_topics(broker: str) -> TalentTopics:
    """Talent's two compacted topics and a consumer group of this test's own (the broker is shared)."""
    topics = TalentTopics.fresh()
    create_talent_topics(
        {"bootstrap.servers": broker}, 3, tenants_topic=topics.tenants, users_topic=topics.users
    )
    return topics


@pytest.fixture
def talent_api() -> Iterator[SimulatedTalentApi]:
    api = SimulatedTalentApi(TalentDataset([], []))
    api.start()
    yield api
    api.stop()


@pytest.fixture(params=[ImportMode.API_PULL, ImportMode.TOPIC_REPLAY], ids=["api-pull", "topic-replay"])
def world(
    request: pytest.FixtureRequest,
    settings: Settings,
    talent_api: SimulatedTalentApi,
    talent_topics: TalentTopics,
) -> Iterator[TalentWorld]:
    """Talent served both ways: each test taking this fixture runs once per import mode."""
    yield from _talent_world(request.param, settings, talent_api, talent_topics)


@pytest.fixture
def another_database(postgres_admin_url: str) -> Iterator[Callable[[], str]]:
    """More fresh databases for one test (parity compares replicas built side by side)."""
    with ExitStack() as databases:
        yield lambda: databases.enter_context(scratch_database(postgres_admin_url))


@pytest.fixture
def api_world(
    settings: Settings, talent_api: SimulatedTalentApi, talent_topics: TalentTopics
) -> Iterator[TalentWorld]:
    yield from _talent_world(ImportMode.API_PULL, settings, talent_api, talent_topics)


@pytest.fixture
def replay_world(
    settings: Settings, talent_api: SimulatedTalentApi, talent_topics: TalentTopics
) -> Iterator[TalentWorld]:
    yield from _talent_world(ImportMode.TOPIC_REPLAY, settings, talent_api, talent_topics)


def _talent_world(
    mode: ImportMode, settings: Settings, talent_api: SimulatedTalentApi, talent_topics: TalentTopics
) -> Iterator[TalentWorld]:
    built = TalentWorld(mode, settings, talent_api, talent_topics)
    yield built
    built.close()

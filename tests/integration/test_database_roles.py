"""Each job as its own database role holding exactly its rows of the grant table (adapters/postgres/grants.py,
the SQL deploy/README.md shows), made as an installation makes them: the administrator's part once, the
schema migrated and the owner's part applied by the owner's role. A fan-out queued by the admin API's role,
run by the fan-out's and published by the relay's; an ApiPull import with a quarantined item replayed by the
admin API; a talent-sync; the admin API's reads. And a role without one row is refused at start, in one line
naming the privilege and the table."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from pin_identity.adapters.postgres import grants
from pin_identity.composition import Container, privileges
from pin_identity.config import ConfigurationError, Settings
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.import_run import ImportMode, RunStatus
from pin_identity.operations.action_log import Actor
from pin_identity.simulation.simulated_talent import SimulatedTalentApi, generate_dataset
from tests.support import seed
from tests.support.database_roles import DatabaseRoles, database_roles
from tests.support.relay import outbox_count, publish_outbox
from tests.support.talent import TalentTopics, produce, replica_state, sync_job
from tests.support.talent_import import TalentWorld
from tests.support.waiting import wait_until

USERS = 30
JOBS = grants.JOBS


@pytest.fixture(scope="module")
def roles(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DatabaseRoles]:
    base = Settings(data_dir=tmp_path_factory.mktemp("roles"))
    with database_roles(postgres_admin_url, base) as made:
        yield made


@pytest.fixture
def containers(roles: DatabaseRoles, settings: Settings) -> Iterator[dict[str, Container]]:
    built = {job: Container(roles.settings(settings, job)) for job in ("migrations", *JOBS)}
    yield built
    for container in built.values():
        container.close()


def test_each_job_holds_its_rows_and_no_other_jobs(
    containers: dict[str, Container], roles: DatabaseRoles
) -> None:
    for job in JOBS:
        containers[job].connections.check_database_grants([job])
    with psycopg.connect(roles.database_url) as conn:  # a row naming no relation would pass that check
        relations = [f"identity.{row.relation}" for row in grants.job_grants()]
        absent = conn.execute(
            "SELECT name FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NULL", (relations,)
        ).fetchall()
    assert absent == []
    with pytest.raises(ConfigurationError, match=r"lacks SELECT on identity\.access_fanout_tasks"):
        containers["outbox-relay"].connections.check_database_grants(["access-fanout"])
    fanout = containers["access-fanout"].connections.database
    with fanout.connection() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("DELETE FROM identity.outbox_events")
    with psycopg.connect(roles.database_url) as conn:  # the role's own, for a session not from our pool
        timeouts = conn.execute(
            "SELECT r.rolname, s.setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
            " WHERE r.rolname = ANY(%s)",
            ([roles.names[job] for job in JOBS],),
        ).fetchall()
    assert sorted(
        name for name, config in timeouts if "idle_in_transaction_session_timeout=60000ms" in config
    ) == (sorted(roles.names[job] for job in JOBS))


_AN_EVENT = """
INSERT INTO identity.outbox_events (event_id, topic, message_key, event_type, correlation_id, value)
VALUES (gen_random_uuid(), 'pin.identity.access.v1', 'k', 'UserAccessChanged', gen_random_uuid(), '{}')"""


def test_a_fan_out_queued_by_serve_runs_as_the_fan_out_and_the_relay_publishes_it(
    containers: dict[str, Container], roles: DatabaseRoles
) -> None:
    owner = containers["migrations"].stores.identity_transactions
    company = seed.company(owner)
    role = seed.role(owner, company)
    for _ in range(USERS):
        seed.grant(owner, seed.user(owner, company), role, company)
    queued = seed.change_permissions(
        containers["serve"].stores.identity_transactions,
        role,
        ["deals.read"],
        FanOutPolicy(inline_threshold=USERS // 2),
    )
    assert queued.task_id is not None
    containers["access-fanout"].jobs.access_fanout().run(threading.Event(), once=True)
    url = roles.database_url
    assert outbox_count(url) >= USERS
    publish_outbox(containers["outbox-relay"])
    assert (outbox_count(url), outbox_count(url, "outbox_dead_letters")) == (0, 0)
    serve = containers["serve"]
    assert [task.status.value for task in serve.use_cases.fanout_admin.tasks()] == ["Completed"]
    assert serve.use_cases.health.dead_letters().count == 0
    backlog = serve.stores.outbox_backlog_reader()
    try:
        assert backlog.backlog().waiting == 0
        with psycopg.connect(roles.url("access-fanout"), application_name="held-writer") as writer:
            writer.execute(_AN_EVENT)  # its transaction stays open, holding the outbox's horizon
            held = backlog.backlog().held_by
            assert held is not None and held.application_name == "held-writer"
            assert held.transaction_s is not None  # another role's session: pg_read_all_stats shows it
            writer.rollback()
    finally:
        backlog.reset()


def test_an_import_runs_as_its_role_and_serve_replays_what_it_quarantined(
    containers: dict[str, Container], roles: DatabaseRoles, settings: Settings,
    talent_api: SimulatedTalentApi, talent_topics: TalentTopics,
) -> None:  # fmt: skip
    world = TalentWorld(
        ImportMode.API_PULL, roles.settings(settings, "talent-import"), talent_api, talent_topics
    )
    try:
        world.publish(generate_dataset(3, USERS, poison=True))
        run = world.run()
    finally:
        world.close()
    assert run.status is RunStatus.COMPLETED and run.users.applied > 0
    serve = containers["serve"]
    assert serve.use_cases.imports.report(run.run_id).lock_holder is None
    assert serve.use_cases.imports.failed_items(run.run_id)
    replayed = serve.use_cases.imports.replay_failed(run.run_id, None, who=Actor("cli:olga"))
    assert replayed.applied + replayed.skipped + replayed.failed > 0


def test_talent_sync_consumes_as_its_role(
    containers: dict[str, Container], talent_topics: TalentTopics
) -> None:
    def replica_users() -> int:
        return len(replica_state(containers["migrations"])["users"])

    before = replica_users()  # an import of this module's may have filled the replica already
    produce(containers["talent-sync"], talent_topics, generate_dataset(2, USERS, seed=11))
    job = sync_job(containers["talent-sync"], talent_topics)
    stop = threading.Event()
    consumer = threading.Thread(target=job.run, args=(stop,), daemon=True)
    consumer.start()
    try:
        wait_until(lambda: replica_users() == before + USERS, "all users in")
    finally:
        stop.set()
        consumer.join(30)


@pytest.fixture
def without(
    request: pytest.FixtureRequest, roles: DatabaseRoles, settings: Settings
) -> Iterator[grants.TableGrant]:
    row: grants.TableGrant = request.param
    roles.revoke(row)
    yield row
    owner = Container(roles.settings(settings, "migrations"))
    try:
        privileges.apply_database_grants(owner.connections, roles.names, administrator=False)
    finally:
        owner.close()


@pytest.mark.parametrize("without", grants.job_grants(), ids=str, indirect=True)
def test_a_role_without_one_row_is_refused_at_start_naming_it(
    without: grants.TableGrant, containers: dict[str, Container]
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        containers[without.job].connections.check_database_grants([without.job])
    line = str(refused.value)
    assert "\n" not in line and line.startswith("PIN_IDENTITY_DATABASE_URL: role pin_identity_")
    assert f"lacks {without.privileges[0]} on identity.{without.relation}" in line

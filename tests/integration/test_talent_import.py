"""The spec's test table (talent-initial-import, Тесты), each row in both modes: the simulated Talent API over
HTTP on loopback, and real compacted topics on the broker."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from pin_identity.composition import Container
from pin_identity.domain.errors import SourceUnavailableError
from pin_identity.domain.import_run import (
    ImportErrorCode,
    ImportMode,
    ImportRefusedError,
    ImportRun,
    PageStatus,
    RunStatus,
    StageCounters,
)
from pin_identity.domain.talent import ImportStage
from pin_identity.entrypoints.cli_common import exit_status
from pin_identity.jobs.talent_import import TalentImportJob
from pin_identity.operations.ports.talent_sources import TalentSource
from pin_identity.simulation.simulated_talent import TalentDataset, generate_dataset
from tests.support import talent
from tests.support.talent_import import FAST, TalentWorld, job
from tests.support.waiting import wait_until


def _rows(world: TalentWorld, sql: Any, params: Any = None) -> list[tuple[Any, ...]]:
    with world.container.connections.database.connection() as conn:
        return conn.execute(sql, params).fetchall()


def _counts(run: ImportRun) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return _stage(run.companies), _stage(run.users)


def _stage(counters: StageCounters) -> tuple[int, ...]:
    return (counters.planned, counters.applied, counters.skipped, counters.failed)


def test_an_empty_source_completes_with_nothing_applied_and_again(world: TalentWorld) -> None:
    world.publish(TalentDataset([], []))
    first, second = world.run(), world.run()
    for run in (first, second):
        assert run.status is RunStatus.COMPLETED
        assert _counts(run) == ((0, 0, 0, 0), (0, 0, 0, 0))


def test_tenants_are_applied_before_any_user_page_is_planned(world: TalentWorld) -> None:
    world.publish(generate_dataset(30, 300, seed=3))

    run = world.run(page_size=25)

    assert run.status is RunStatus.COMPLETED
    assert _counts(run)[1] == (300, 300, 0, 0)  # no IDENTITY_SYNC_COMPANY_NOT_FOUND
    [(last_tenant_done, first_user_planned)] = _rows(
        world,
        "SELECT max(updated_at) FILTER (WHERE stage = 'Tenants'),"
        " min(created_at) FILTER (WHERE stage = 'Users')"
        " FROM identity.talent_import_pages WHERE run_id = %s",
        [run.run_id],
    )
    assert last_tenant_done <= first_user_planned


def test_a_second_run_over_a_filled_replica_changes_nothing(world: TalentWorld) -> None:
    world.publish(generate_dataset(10, 60, seed=4))
    world.run(page_size=20)
    state = talent.replica_state(world.container)
    events = _rows(world, "SELECT count(*) FROM identity.outbox_events")

    again = world.run(page_size=20)

    assert _counts(again) == ((10, 0, 10, 0), (60, 0, 60, 0))
    assert talent.replica_state(world.container) == state
    assert _rows(world, "SELECT count(*) FROM identity.outbox_events") == events
    assert all(len(user[-1]) == 1 for user in state["users"])


def test_a_run_interrupted_mid_stage_resumes_from_its_pending_pages(world: TalentWorld) -> None:
    world.publish(generate_dataset(12, 40, seed=5))
    runner = job(world.container)
    run = world.start(runner, page_size=4)
    for _ in range(3):  # plan, then apply a few Tenants pages, then the process "dies"
        runner.step(world.container.stores.import_store.load_run(run.run_id) or run)
    runner.close()
    runner.lock.release()
    done_before = _rows(
        world,
        "SELECT id, updated_at FROM identity.talent_import_pages WHERE run_id = %s AND status = 'Done'",
        [run.run_id],
    )
    assert done_before

    resumed = world.run(page_size=4)

    assert (resumed.run_id, resumed.status) == (run.run_id, RunStatus.COMPLETED)
    assert _counts(resumed) == ((12, 12, 0, 0), (40, 40, 0, 0))
    after = dict(
        _rows(
            world, "SELECT id, updated_at FROM identity.talent_import_pages WHERE run_id = %s", [run.run_id]
        )
    )
    assert all(after[page_id] == updated for page_id, updated in done_before)  # Done pages were not replayed


def test_poison_items_are_quarantined_and_the_run_still_completes(world: TalentWorld) -> None:
    dataset = generate_dataset(8, 40, seed=6, poison=True)
    world.publish(dataset)

    run = world.run(page_size=10)

    assert run.status is RunStatus.COMPLETED
    codes = sorted(item.error_code for item in world.container.stores.import_store.failed_items(run.run_id))
    assert codes == [
        "IDENTITY_SYNC_COMPANY_NOT_FOUND",  # the user of the quarantined tenant
        "IDENTITY_SYNC_INVALID_PAYLOAD",
        "IDENTITY_SYNC_PHONE_CONFLICT",
        "IDENTITY_SYNC_UNKNOWN_COMPANY_TYPE",
    ]
    assert _counts(run) == ((9, 8, 0, 1), (43, 40, 0, 3))


def test_each_new_manager_gets_one_default_role_and_an_access_event(world: TalentWorld) -> None:
    world.publish(generate_dataset(3, 12, seed=8))

    world.run()

    users = talent.replica_state(world.container)["users"]
    assert len(users) == 12
    assert all(user[-1] == [f"developer-manager@{user[1]}"] for user in users)
    events = talent.outbox_events(world.container)
    access = [e for e in events if e["eventType"] == "UserAccessChanged"]
    assert sorted(e["payload"]["userId"] for e in access) == sorted(user[0] for user in users)
    assert {e["payload"]["changeReason"] for e in access} == {"RoleAssigned"}


def test_a_dry_run_writes_nothing_and_counts_what_a_real_run_would(world: TalentWorld) -> None:
    world.publish(generate_dataset(6, 30, seed=9, poison=True))

    dry = world.run(page_size=7, dry_run=True)

    assert dry.status is RunStatus.COMPLETED and dry.dry_run
    assert talent.replica_state(world.container) == {"companies": [], "users": []}
    assert _rows(world, "SELECT count(*) FROM identity.outbox_events") == [(0,)]
    assert world.container.stores.import_store.failed_items(dry.run_id) == []
    real = world.run(page_size=7)
    assert _counts(dry) == _counts(real)


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_dry_run_counts_a_later_pages_repeat_and_deletion_as_the_real_run_and_raises_no_signal(
    world: TalentWorld,
) -> None:
    """One item a page: a manager repeated on later pages (Talent's retry, the same version) is skipped by a
    real run, and so by a dry run; a manager deleted on a later page is blocked by both; a phone conflict is
    counted by both, but only the real run quarantines it and counts it (and the skips) in the metrics."""
    company = talent.tenant()
    repeated, deleted, first_holder = (talent.user(company["tenantId"]) for _ in range(3))
    conflicting = talent.user(company["tenantId"], phone=first_holder["phone"])
    users = [
        repeated,
        deleted,
        first_holder,
        conflicting,
        repeated,
        {**deleted, "version": 2, "isDeleted": True},
        repeated,
    ]
    world.publish(TalentDataset([company], users))
    conflicts = _metric("talent_sync_conflicts_total")
    stale = _metric("talent_sync_stale_events_total", aggregate="user")

    dry = world.run(page_size=1, dry_run=True)
    signals = (
        _metric("talent_sync_conflicts_total") - conflicts,
        _metric("talent_sync_stale_events_total", aggregate="user") - stale,
    )
    real = world.run(page_size=1)

    assert _counts(dry) == _counts(real) == ((1, 1, 0, 0), (7, 4, 2, 1))
    assert signals == (0, 0)  # the dry run's prediction raised nothing
    assert (
        _metric("talent_sync_conflicts_total") - conflicts,
        _metric("talent_sync_stale_events_total", aggregate="user") - stale,
    ) == (1, 2)


class _SignalledAfterReads:
    """A source that raises a signal (SIGINT's or SIGTERM's effect) while its n-th page is being read."""

    def __init__(self, inner: TalentSource, signal: threading.Event, reads: int):
        self._inner, self._signal, self._left = inner, signal, reads

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, *args: Any) -> Any:
        self._left -= 1
        if self._left == 0:
            self._signal.set()
        return self._inner.read(*args)


def _signalled_run(world: TalentWorld, signal: threading.Event) -> tuple[TalentImportJob, ImportRun]:
    world.publish(generate_dataset(20, 0, seed=10))
    runner = job(world.container)
    runner.sources = lambda mode: _SignalledAfterReads(
        world.container.jobs.talent_source(mode), signal, reads=2
    )
    return runner, world.start(runner, page_size=2)


def test_cancelling_stops_after_the_current_page_and_keeps_done_pages(world: TalentWorld) -> None:
    interrupted = threading.Event()  # Ctrl-C: a cancel, and a stop that wakes the job's waits
    runner, run = _signalled_run(world, interrupted)

    ended = runner.drive(run, interrupted, cancel=interrupted)

    assert ended.status is RunStatus.CANCELLED
    assert world.container.stores.import_store.progress(run.run_id).count(status=PageStatus.DONE) == 2
    assert len(talent.replica_state(world.container)["companies"]) == 4


def test_a_stop_leaves_the_run_running_after_the_current_page_for_the_next_process(
    world: TalentWorld,
) -> None:
    terminated = threading.Event()  # SIGTERM: the pod is being stopped, not the run
    runner, run = _signalled_run(world, terminated)

    left = runner.drive(run, terminated, cancel=threading.Event())
    progress = world.container.stores.import_store.progress(run.run_id)
    lock_holder = world.container.stores.run_lock().holder()
    resumed = world.run(page_size=2)

    assert (
        left.status,
        progress.count(status=PageStatus.DONE),
        progress.count(status=PageStatus.IN_PROGRESS),
    ) == (
        RunStatus.RUNNING,
        2,
        0,
    )
    assert lock_holder is None
    assert (resumed.run_id, resumed.status, resumed.companies.applied) == (
        run.run_id,
        RunStatus.COMPLETED,
        20,
    )


def test_a_tenant_filter_imports_one_company_and_its_users(world: TalentWorld) -> None:
    dataset = generate_dataset(5, 50, seed=11)
    world.publish(dataset)
    chosen = dataset.tenants[2]["tenantId"]

    run = world.run(tenant_filter=uuid.UUID(chosen))

    state = talent.replica_state(world.container)
    assert [c[0] for c in state["companies"]] == [chosen]
    expected_users = sorted(u["userId"] for u in dataset.users if u["tenantId"] == chosen)
    assert [u[0] for u in state["users"]] == expected_users
    assert run.users.applied == len(expected_users)


def test_an_unavailable_source_is_refused_before_anything_is_written(world: TalentWorld) -> None:
    if world.mode is ImportMode.API_PULL:
        world.api.healthy = False
    else:
        world.topics = type(world.topics)("missing.tenants", "missing.users", world.topics.group)
    with pytest.raises(ImportRefusedError) as refused:
        world.run()
    assert (refused.value.code, exit_status(refused.value)) == (ImportErrorCode.SOURCE_UNAVAILABLE, 4)
    assert _rows(world, "SELECT count(*) FROM identity.talent_import_runs") == [(0,)]


def test_a_source_listing_far_fewer_companies_than_the_replica_is_refused_unless_forced(
    world: TalentWorld,
) -> None:
    dataset = generate_dataset(10, 0, seed=12)
    talent.tenants(world.container, *dataset.tenants)
    world.publish(TalentDataset(dataset.tenants[:3], []))

    with pytest.raises(ImportRefusedError) as refused:
        world.run()
    forced = world.run(force=True)

    assert (refused.value.code, exit_status(refused.value)) == (ImportErrorCode.SOURCE_INCOMPLETE, 4)
    assert forced.status is RunStatus.COMPLETED


class _UsersUnreadable:
    """A source whose Users pages cannot be read (Talent keeps answering 503 for them)."""

    def __init__(self, inner: TalentSource):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, stage: ImportStage, *args: Any) -> Any:
        if stage is ImportStage.USERS:
            raise SourceUnavailableError("Talent API: HTTP 503")
        return self._inner.read(stage, *args)


def test_a_page_failing_every_attempt_fails_the_run_and_keeps_the_other_pages(world: TalentWorld) -> None:
    world.publish(generate_dataset(4, 10, seed=13))
    runner = job(world.container)
    runner.sources = lambda mode: _UsersUnreadable(world.container.jobs.talent_source(mode))
    run = world.start(runner, page_size=5)

    ended = runner.drive(run, threading.Event())

    assert (ended.status, ended.error_code) == (RunStatus.FAILED, "IDENTITY_IMPORT_PAGES_FAILED")
    pages = _rows(
        world, "SELECT stage, status, attempt_count FROM identity.talent_import_pages ORDER BY stage"
    )
    assert {(stage, status) for stage, status, _ in pages} == {("Tenants", "Done"), ("Users", "Failed")}
    assert {attempts for stage, _, attempts in pages if stage == "Users"} == {FAST.max_page_attempts}
    assert len(talent.replica_state(world.container)["companies"]) == 4


def test_a_flaky_slow_api_still_imports_everything(api_world: TalentWorld) -> None:
    world = api_world
    world.publish(generate_dataset(10, 80, seed=14))
    world.api.fail_every, world.api.delay_s = 3, 0.02

    run = world.run(page_size=9)

    assert _counts(run) == ((10, 10, 0, 0), (80, 80, 0, 0))


def _consumed_total() -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "talent_sync_items"
        for sample in metric.samples
        if sample.name == "talent_sync_items_total"
    )


def test_a_completed_replay_hands_the_consumer_group_over_where_it_ended(replay_world: TalentWorld) -> None:
    world = replay_world
    world.publish(generate_dataset(5, 30, seed=15))

    world.run()
    group = Consumer({**world.container.connections.kafka_client_config, "group.id": world.topics.group})
    ends, committed = [], []
    for topic in (world.topics.tenants, world.topics.users):
        for partition in group.list_topics(topic, timeout=10).topics[topic].partitions:
            ends.append(group.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1])
            committed.append(group.committed([TopicPartition(topic, partition)], timeout=10)[0].offset)
    group.close()
    before = _consumed_total()
    talent.run_until_caught_up(talent.sync_job(world.container, world.topics))

    assert committed == ends
    assert _consumed_total() == before  # the consumer resumed at the end of the replay: nothing read twice


def test_a_planner_with_a_stale_view_of_the_run_changes_nothing(api_world: TalentWorld) -> None:
    world = api_world
    world.publish(generate_dataset(9, 0, seed=16))
    runner = job(world.container)
    run = world.start(runner, page_size=4)
    source = world.container.jobs.talent_source(world.mode)
    step = source.plan(ImportStage.TENANTS, None, 0, 4, None)
    source.close()

    first = world.container.stores.import_store.add_planned_pages(run, ImportStage.TENANTS, step)
    again = world.container.stores.import_store.add_planned_pages(
        run, ImportStage.TENANTS, step
    )  # the same stale view

    assert (first, again) == (True, False)
    assert world.container.stores.import_store.progress(run.run_id).count() == 1
    assert world.container.stores.import_store.load_run(run.run_id).companies.planned == 4  # type: ignore[union-attr]
    runner.lock.release()


def test_a_worker_that_cannot_read_the_source_leaves_the_run_to_others(api_world: TalentWorld) -> None:
    world = api_world
    world.publish(generate_dataset(3, 0, seed=17))
    runner = job(world.container)
    run = world.start(runner)
    runner.lock.release()  # the run waits for an orchestrator
    unconfigured = Container(world.settings.model_copy(update={"talent_api_url": None}))

    helper = unconfigured.jobs.talent_import()
    moved = helper.step(run)
    helper.close()
    unconfigured.close()

    assert (moved, helper.orchestrating) == (False, False)
    assert (
        world.container.stores.import_store.progress(run.run_id).count() == 0
    )  # nothing planned, nothing claimed
    assert world.container.stores.run_lock().holder() is None


class _TalentWritesDuringTheReplay:
    """Talent publishes a new company and its manager right after the replay planned its Tenants stage."""

    def __init__(self, inner: TalentSource, publish: Any):
        self._inner, self._publish = inner, publish

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def plan(self, stage: ImportStage, *args: Any) -> Any:
        step = self._inner.plan(stage, *args)
        if stage is ImportStage.TENANTS:
            self._publish()
        return step


def test_a_user_written_during_a_replay_is_left_to_the_consumer_not_lost(replay_world: TalentWorld) -> None:
    world = replay_world
    world.publish(generate_dataset(3, 9, seed=18))
    late_company = talent.tenant()
    late_manager = talent.user(late_company["tenantId"])
    runner = job(
        world.container,
        sources=lambda mode: _TalentWritesDuringTheReplay(
            world.container.jobs.talent_source(mode),
            lambda: world.publish(TalentDataset([late_company], [late_manager])),
        ),
    )
    run = world.start(runner)

    ended = runner.drive(run, threading.Event())
    replayed = {u[0] for u in talent.replica_state(world.container)["users"]}
    talent.run_until_caught_up(talent.sync_job(world.container, world.topics))

    assert ended.status is RunStatus.COMPLETED and ended.users.failed == 0
    assert late_manager["userId"] not in replayed
    assert late_manager["userId"] in {u[0] for u in talent.replica_state(world.container)["users"]}


def test_an_orchestrator_whose_lock_session_died_steps_down(api_world: TalentWorld) -> None:
    world = api_world
    world.publish(generate_dataset(4, 0, seed=19))
    runner = job(world.container)
    run = world.start(runner, page_size=2)
    runner.orchestrating = True
    with world.container.connections.database.connection() as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name LIKE 'pin-identity talent-import%%'"
        )
        conn.commit()
    successor = world.container.stores.run_lock()
    wait_until(successor.try_acquire, "the terminated session to release the lock")  # it exits asynchronously

    runner.step(run)

    assert runner.orchestrating is False
    assert (
        world.container.stores.import_store.progress(run.run_id).count() == 0
    )  # it planned nothing meanwhile
    successor.release()
    runner.close()


def test_hostile_items_are_quarantined_and_the_good_ones_around_them_apply(world: TalentWorld) -> None:
    good = [talent.tenant() for _ in range(2)]
    hostile = [
        talent.tenant(version=float("nan")),  # NaN on the wire: not JSON
        talent.tenant(name="\ud800"),  # a lone surrogate escape: valid JSON, no text column can hold it
        talent.tenant(name="N" * 5000),  # over the field's limit
    ]
    users = [talent.user(good[0]["tenantId"]), talent.user(good[1]["tenantId"], version=float("inf"))]
    world.publish(TalentDataset([good[0], *hostile, good[1]], users))

    run = world.run(page_size=10)

    assert run.status is RunStatus.COMPLETED
    failed = world.container.stores.import_store.failed_items(run.run_id)
    assert [item.error_code for item in failed] == ["IDENTITY_SYNC_INVALID_PAYLOAD"] * 4
    assert _counts(run) == ((5, 2, 0, 3), (2, 1, 0, 1))

"""The import's orchestration over in-memory ports: planning ahead, the Tenants-before-Users barrier, planning
failures, the end of a run and the replay's handover, the lock; and the job that runs it with the pages."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime
from typing import Any

from pin_identity.config import ImportSettings
from pin_identity.domain.errors import SourceNotConfiguredError
from pin_identity.domain.import_run import (
    ImportMode,
    ImportPage,
    ImportRun,
    PageStatus,
    RunStatus,
)
from pin_identity.domain.talent import ImportStage
from pin_identity.jobs.import_orchestrator import ImportOrchestrator
from pin_identity.jobs.talent_import import TalentImportJob
from pin_identity.operations.ports.talent_sources import TalentSource
from tests.support.clocks import ManualClock
from tests.support.import_observer import RecordingImportObserver
from tests.support.memory_talent import MemoryImportStore, MemoryRunLock, MemorySource, tenant_item, user_item

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SETTINGS = ImportSettings(plan_ahead_pages=3, max_planning_failures=3, backoff_base_s=0.0, lock_retry_s=0.0)


def _orchestrator(store: MemoryImportStore, lock: MemoryRunLock | None = None) -> ImportOrchestrator:
    return ImportOrchestrator(store, lock or MemoryRunLock(), SETTINGS, ManualClock(NOW))


def _source(tenants: int, users_per_tenant: int = 0) -> MemorySource:
    ids = [uuid.uuid4() for _ in range(tenants)]
    return MemorySource(
        [tenant_item(t) for t in ids], [user_item(t) for t in ids for _ in range(users_per_tenant)]
    )


def _finish_pages(store: MemoryImportStore, stage: ImportStage, status: PageStatus = PageStatus.DONE) -> None:
    for row in store.pages:
        if row.page.stage is stage:
            row.status = status


def test_it_plans_a_few_pages_ahead_not_the_whole_listing() -> None:
    store, source = MemoryImportStore(), _source(10)
    run = store.start(page_size=1)

    assert _orchestrator(store).plan_ahead(run, source) is True

    assert store.statuses() == [PageStatus.PENDING] * SETTINGS.plan_ahead_pages


def test_no_users_page_is_planned_before_every_tenants_page_is_done() -> None:
    store, source = MemoryImportStore(), _source(2, 1)
    orchestrator = _orchestrator(store)
    run = store.start(page_size=1)
    orchestrator.plan_ahead(run, source)  # both Tenants pages: the stage is listed
    store.pages[0].status = PageStatus.DONE

    held = orchestrator.plan_ahead(store.runs[run.run_id], source)
    _finish_pages(store, ImportStage.TENANTS)
    released = orchestrator.plan_ahead(store.runs[run.run_id], source)

    assert (held, released) == (False, True)
    assert source.plans == [ImportStage.TENANTS] * 2 + [ImportStage.USERS] * 2
    assert store.statuses(ImportStage.USERS) == [PageStatus.PENDING] * 2


def test_planning_that_keeps_failing_fails_the_run() -> None:
    store, source = MemoryImportStore(), _source(3)
    source.unavailable_plans = SETTINGS.max_planning_failures
    run = store.start()
    orchestrator = _orchestrator(store)

    tries = [orchestrator.plan_ahead(store.runs[run.run_id], source) for _ in range(3)]

    assert tries == [False, False, True]
    assert (store.runs[run.run_id].status, store.runs[run.run_id].error_code) == (
        RunStatus.FAILED,
        "IDENTITY_IMPORT_PLANNING_FAILED",
    )


def test_a_source_refusing_our_credentials_fails_the_run_at_once() -> None:
    store, source = MemoryImportStore(), _source(3)
    source.rejected = True
    run = store.start()

    _orchestrator(store).plan_ahead(run, source)

    assert store.runs[run.run_id].error_code == "IDENTITY_IMPORT_SOURCE_UNAVAILABLE"


def test_a_run_ends_once_no_page_is_open_failed_if_a_page_failed() -> None:
    store, source = MemoryImportStore(), _source(2)
    orchestrator = _orchestrator(store)
    run = store.start(page_size=1)
    orchestrator.plan_ahead(run, source)

    open_pages = orchestrator.finish_if_done(run, source)
    _finish_pages(store, ImportStage.TENANTS, PageStatus.FAILED)
    ended = orchestrator.finish_if_done(run, source)

    assert (open_pages, ended) == (False, True)
    assert (store.runs[run.run_id].status, store.runs[run.run_id].error) == (
        RunStatus.FAILED,
        "2 pages failed",
    )


def test_a_complete_replay_of_every_company_hands_its_offsets_over_a_filtered_one_does_not() -> None:
    outcomes = []
    for tenant_filter in (None, uuid.uuid4()):
        store, source = MemoryImportStore(), _source(1)
        orchestrator = _orchestrator(store)
        run = store.start(ImportMode.TOPIC_REPLAY, tenant_filter=tenant_filter)
        orchestrator.plan_ahead(run, source)
        _finish_pages(store, ImportStage.TENANTS)
        orchestrator.plan_ahead(store.runs[run.run_id], source)  # Users: nothing to list
        orchestrator.finish_if_done(run, source)
        outcomes.append((store.runs[run.run_id].status, source.handed_over))

    assert outcomes == [(RunStatus.COMPLETED, [[None]]), (RunStatus.COMPLETED, [])]


def test_it_takes_a_free_lock_steps_down_when_its_session_died_and_leaves_a_held_one() -> None:
    store, lock = MemoryImportStore(), MemoryRunLock()
    orchestrator = _orchestrator(store, lock)
    run = store.start()

    taken = orchestrator.lead(run)
    lock.session_died, lock.taken_by_another = True, True
    lost = orchestrator.lead(run)

    assert (taken, lost, orchestrator.orchestrating) == (True, False, False)


def test_the_job_drives_a_run_to_its_end_on_its_pages() -> None:
    store, source = MemoryImportStore(), _source(3, 2)
    job = TalentImportJob(store, MemoryRunLock(), lambda mode: source, SETTINGS, ManualClock(NOW))
    run = store.start(page_size=2)

    ended = job.drive(run, threading.Event())

    assert (ended.status, ended.companies.applied, ended.users.applied) == (RunStatus.COMPLETED, 3, 6)
    assert set(store.statuses()) == {PageStatus.DONE} and job.orchestrating is False


class DatabaseAway(MemoryImportStore):
    """The store's reads of the run and its claims fail `failures` times (a failover), then answer."""

    failures = 0

    def _away(self) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("server closed the connection unexpectedly")

    def load_run(self, run_id: uuid.UUID) -> ImportRun | None:
        self._away()
        return super().load_run(run_id)

    def claim(self, *args: Any) -> ImportPage | None:
        self._away()
        return super().claim(*args)


class RecordedWaits:
    """A stop signal never set, whose waits return at once and are recorded."""

    def __init__(self) -> None:
        self.waits: list[float | None] = []

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return False


def test_a_database_away_for_a_while_fails_steps_not_the_run_and_the_steps_back_off() -> None:
    store, source, observer = DatabaseAway(), _source(3, 2), RecordingImportObserver()
    settings = SETTINGS.model_copy(update={"backoff_base_s": 1.0, "backoff_max_s": 60.0})
    job = TalentImportJob(store, MemoryRunLock(), lambda mode: source, settings, ManualClock(NOW), observer)
    run = store.start(page_size=2)
    store.failures, stop = 4, RecordedWaits()

    ended = job.drive(run, stop)

    assert (ended.status, ended.companies.applied, ended.users.applied) == (RunStatus.COMPLETED, 3, 6)
    assert observer.calls.count("step failed: server closed the connection unexpectedly") == 4
    # While the steps fail, the waits back off from a second up (not the 0.2 s idle wait: ten tries a second).
    backing_off = stop.waits[:2]
    assert min(wait or 0 for wait in backing_off) >= 1.0 and backing_off == sorted(backing_off), stop.waits


def test_a_job_that_cannot_read_the_source_leaves_the_run_to_others() -> None:
    def unconfigured(mode: ImportMode) -> TalentSource:
        raise SourceNotConfiguredError("PIN_IDENTITY_TALENT_API_URL: required for the api-pull import")

    store, lock = MemoryImportStore(), MemoryRunLock()
    job = TalentImportJob(store, lock, unconfigured, SETTINGS, ManualClock(NOW))

    assert job.step(store.start()) is False
    assert (lock.held_by_us, store.pages) == (False, [])


def test_a_page_refused_by_talent_fails_the_run_whoever_worked_on_it() -> None:
    store, source, lock = MemoryImportStore(), _source(1), MemoryRunLock(taken_by_another=True)
    run = store.start()
    _orchestrator(store).plan_ahead(run, source)
    source.rejected = True
    helper = TalentImportJob(store, lock, lambda mode: source, SETTINGS, ManualClock(NOW))

    assert helper.step(store.runs[run.run_id]) is True
    assert (store.runs[run.run_id].status, helper.orchestrating) == (RunStatus.FAILED, False)


def test_the_observer_hears_a_run_from_its_lock_to_its_end() -> None:
    store, source, observer = MemoryImportStore(), _source(2, 1), RecordingImportObserver()
    lock = MemoryRunLock(held_by_us=True)  # as `talent-import run` holds it
    job = TalentImportJob(store, lock, lambda mode: source, SETTINGS, ManualClock(NOW), observer)

    job.drive(store.start(page_size=10), threading.Event())

    assert observer.calls == [
        "orchestrating",
        "Tenants planned: 1 pages",
        "claimed Tenants 0",
        "applied Tenants 0: 2 of 2",
        "Tenants completed",
        "Users planned: 1 pages",
        "claimed Users 0",
        "applied Users 0: 2 of 2",
        "Users completed",
        "Completed",
        "stepped down",
    ]


def test_the_observer_hears_each_planning_retry_then_the_failed_run() -> None:
    store, source, observer = MemoryImportStore(), _source(3), RecordingImportObserver()
    source.unavailable_plans = SETTINGS.max_planning_failures
    run = store.start()
    orchestrator = ImportOrchestrator(store, MemoryRunLock(), SETTINGS, ManualClock(NOW), observer)

    for _ in range(SETTINGS.max_planning_failures):
        orchestrator.plan_ahead(store.runs[run.run_id], source)

    retry = "planning retry: Talent API: HTTP 503"
    assert observer.calls == [retry, retry, "Failed IDENTITY_IMPORT_PLANNING_FAILED"]


def test_the_observer_hears_the_lock_taken_and_lost_and_an_unreadable_source_once() -> None:
    def unconfigured(mode: ImportMode) -> TalentSource:
        raise SourceNotConfiguredError("PIN_IDENTITY_TALENT_API_URL: required for the api-pull import")

    store, lock, observer = MemoryImportStore(), MemoryRunLock(), RecordingImportObserver()
    run = store.start()
    orchestrator = ImportOrchestrator(store, lock, SETTINGS, ManualClock(NOW), observer)
    orchestrator.lead(run)
    lock.session_died, lock.taken_by_another = True, True
    orchestrator.lead(run)
    cannot_read = TalentImportJob(store, lock, unconfigured, SETTINGS, ManualClock(NOW), observer)
    for _ in range(2):
        cannot_read.step(run)

    assert observer.calls == ["orchestrating", "lock taken", "lock lost", "cannot read ApiPull"]

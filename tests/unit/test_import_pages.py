"""The import's page worker over in-memory ports: claim, read, apply and complete in one transaction; release
with a back-off; a lost lease writes nothing; a filtered run keeps its company's items; a dry run counts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from pin_identity.adapters.talent_wire import read_item
from pin_identity.config import ImportSettings
from pin_identity.domain.errors import SourceRejectedError
from pin_identity.domain.import_run import (
    ImportMode,
    ImportRun,
    PageStatus,
    RunEnding,
    StageCounters,
)
from pin_identity.domain.talent import ImportStage
from pin_identity.jobs.import_pages import PageWorker
from tests.support.clocks import ManualClock
from tests.support.import_observer import RecordingImportObserver
from tests.support.memory_talent import MemoryImportStore, MemorySource, tenant_item, user_item

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SETTINGS = ImportSettings(max_page_attempts=3, backoff_base_s=2.0, backoff_max_s=60.0)


def _planned(
    store: MemoryImportStore,
    source: MemorySource,
    stage: ImportStage,
    run: ImportRun | None = None,
    **request: Any,
) -> ImportRun:
    """A run (a new one unless given) with every page of `stage` listed, as the orchestrator would have."""
    run = run or store.start(**request)
    while not (stage is ImportStage.TENANTS and run.tenants_listed) and not (
        stage is ImportStage.USERS and run.users_listed
    ):
        step = source.plan(stage, run.plan_cursor, run.plan_page_no, run.page_size, run.tenant_filter)
        assert store.add_planned_pages(run, stage, step)
        run = store.runs[run.run_id]
    return run


def _worker(store: MemoryImportStore) -> PageWorker:
    return PageWorker(store, SETTINGS, ManualClock(NOW))


def test_with_no_free_page_nothing_happens() -> None:
    store = MemoryImportStore()
    assert _worker(store).work(store.start(), MemorySource()) is False


def test_a_page_is_applied_and_completed_with_its_counters_in_one_transaction() -> None:
    store, source = (
        MemoryImportStore(),
        MemorySource(tenants=[tenant_item(), tenant_item(companyType="Shop")]),
    )
    run = _planned(store, source, ImportStage.TENANTS)

    assert _worker(store).work(run, source) is True

    [row] = store.pages
    assert (row.status, row.counters) == (PageStatus.DONE, StageCounters(2, 1, 0, 1))
    assert store.runs[run.run_id].companies == StageCounters(2, 1, 0, 1)  # planned when listed (ApiPull)
    assert len(store.replica.state.companies) == 1 and len(store.replica.state.quarantine) == 1


def test_a_replayed_page_counts_what_it_planned_when_it_is_applied() -> None:
    store, source = MemoryImportStore(), MemorySource(tenants=[tenant_item()])
    run = _planned(store, source, ImportStage.TENANTS, mode=ImportMode.TOPIC_REPLAY)

    listed = store.runs[run.run_id].companies.planned

    _worker(store).work(run, source)

    assert store.runs[run.run_id].companies.planned - listed == 1  # a replayed page learns its size when read


def test_a_page_that_cannot_be_read_is_released_with_a_back_off_until_its_attempts_are_spent() -> None:
    store, source = (
        MemoryImportStore(),
        MemorySource(tenants=[tenant_item()], unreadable={ImportStage.TENANTS}),
    )
    run = _planned(store, source, ImportStage.TENANTS)
    worker = PageWorker(store, SETTINGS, ManualClock(NOW))

    worker.work(run, source)
    [row] = store.pages
    first = (row.status, row.available_at, row.error)
    row.available_at = None  # the back-off has passed
    for _ in range(2):
        worker.work(run, source)
        row.available_at = None

    assert first == (
        PageStatus.PENDING,
        NOW + timedelta(seconds=2),
        "SourceUnavailableError: Talent API: HTTP 503",
    )
    assert (row.status, row.page.attempt) == (PageStatus.FAILED, 3)
    assert store.replica.state.companies == {}


def test_a_page_whose_lease_was_lost_writes_nothing_and_releases_nothing() -> None:
    store, source = MemoryImportStore(), MemorySource(tenants=[tenant_item()])
    run = _planned(store, source, ImportStage.TENANTS)
    store.lease_lost = True

    assert _worker(store).work(run, source) is True

    assert (store.statuses(), store.replica.state.companies) == ([PageStatus.IN_PROGRESS], {})


def test_talent_refusing_our_credentials_is_left_to_the_caller() -> None:
    store, source = MemoryImportStore(), MemorySource(tenants=[tenant_item()])
    run = _planned(store, source, ImportStage.TENANTS)
    source.rejected = True

    with pytest.raises(SourceRejectedError):
        _worker(store).work(run, source)


def test_a_filtered_run_applies_its_company_its_users_and_the_tombstones_of_its_users() -> None:
    store, chosen, other = MemoryImportStore(), uuid.uuid4(), uuid.uuid4()
    leaving = user_item(chosen)
    source = MemorySource(
        [tenant_item(chosen), tenant_item(other)], [leaving, user_item(chosen), user_item(other)]
    )
    first = _planned(store, source, ImportStage.TENANTS, tenant_filter=chosen)
    _worker(store).work(first, source)
    first = _planned(store, source, ImportStage.USERS, first)
    _worker(store).work(first, source)
    store.finish_run(first.run_id, RunEnding.completed(), NOW)
    assert leaving.talent_id is not None
    gone = [read_item(ImportStage.USERS, str(user), None) for user in (leaving.talent_id, uuid.uuid4())]
    source.users = gone
    second = _planned(store, source, ImportStage.USERS, tenant_filter=chosen)
    _worker(store).work(second, source)

    assert list(store.replica.state.companies) == [chosen]
    assert [r.counters.planned for r in store.pages] == [1, 2, 1]  # of each page, what is in scope
    assert store.replica.state.users[leaving.talent_id].status == "Blocked"


def test_a_dry_run_counts_without_writing() -> None:
    store, source = MemoryImportStore(), MemorySource(tenants=[tenant_item(), tenant_item()])
    run = _planned(store, source, ImportStage.TENANTS, dry_run=True)

    _worker(store).work(run, source)

    assert store.runs[run.run_id].companies.applied == 2
    assert store.replica.state.companies == {} and len(store.dry_runs[run.run_id].tenant_ids) == 2


def _observed(store: MemoryImportStore) -> tuple[PageWorker, RecordingImportObserver]:
    observer = RecordingImportObserver()
    return PageWorker(store, SETTINGS, ManualClock(NOW), observer), observer


def test_the_observer_hears_a_page_claimed_then_applied() -> None:
    store, source = (
        MemoryImportStore(),
        MemorySource(tenants=[tenant_item(), tenant_item(companyType="Shop")]),
    )
    run = _planned(store, source, ImportStage.TENANTS)
    worker, observer = _observed(store)

    worker.work(run, source)

    assert observer.calls == ["claimed Tenants 0", "applied Tenants 0: 1 of 2"]


def test_the_observer_hears_each_release_of_a_failing_page_the_last_one_final() -> None:
    store, source = (
        MemoryImportStore(),
        MemorySource(tenants=[tenant_item()], unreadable={ImportStage.TENANTS}),
    )
    run = _planned(store, source, ImportStage.TENANTS)
    worker, observer = _observed(store)

    for _ in range(SETTINGS.max_page_attempts):
        worker.work(run, source)
        store.pages[0].available_at = None  # the back-off has passed

    released = "released Tenants 0: {} (SourceUnavailableError: Talent API: HTTP 503)"
    assert observer.calls == ["claimed Tenants 0", released.format("Pending")] * 2 + [
        "claimed Tenants 0",
        released.format("Failed"),
    ]


def test_the_observer_hears_a_lost_lease_and_nothing_else() -> None:
    store, source = MemoryImportStore(), MemorySource(tenants=[tenant_item()])
    run = _planned(store, source, ImportStage.TENANTS)
    store.lease_lost = True
    worker, observer = _observed(store)

    worker.work(run, source)

    assert observer.calls == ["claimed Tenants 0", "lease lost Tenants 0"]


def test_the_page_lines_name_the_runs_correlation_id_and_a_quarantined_item_its_page() -> None:
    """The spec's log fields: page-claimed with the CorrelationId, item-quarantined with the page number and
    the CorrelationId, so that a quarantined item leads to its page and run."""
    store = MemoryImportStore()
    source = MemorySource(tenants=[tenant_item(), tenant_item(), tenant_item(companyType="Shop")])
    run = _planned(store, source, ImportStage.TENANTS, page_size=2)
    worker = _worker(store)

    with capture_logs() as logs:
        while worker.work(run, source):
            pass

    correlation = str(run.correlation_id)
    claimed = [line for line in logs if line["event"] == "page-claimed"]
    assert [(line["page_no"], line["correlation_id"]) for line in claimed] == [
        (0, correlation),
        (1, correlation),
    ]
    [quarantined] = [line for line in logs if line["event"] == "item-quarantined"]
    assert (quarantined["page_no"], quarantined["correlation_id"]) == (1, correlation)
    assert quarantined["run_id"] == str(run.run_id) and quarantined["stage"] == "Tenants"

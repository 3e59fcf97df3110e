"""The operator service's decisions over in-memory stores: refusals, the run lock taken once, one audit line
per action (and none for a refused one), the read models."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from structlog.testing import capture_logs

from pin_identity.domain.errors import (
    ConflictError,
    ImportNotRunningError,
    NotFoundError,
    SourceUnavailableError,
)
from pin_identity.domain.import_run import (
    ImportErrorCode,
    ImportMode,
    ImportRefusedError,
    ImportRequest,
    ImportRun,
    PageProgress,
    PageStatus,
    RunStatus,
    StageCounters,
)
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.domain.talent import ImportStage
from pin_identity.operations.action_log import Actor
from pin_identity.operations.fanout_admin import FanOutAdmin
from pin_identity.operations.import_admin import ImportOperations
from pin_identity.operations.ports.fanout_tasks import FanOutTaskView, NewerAnnouncement, TaskReplay
from pin_identity.operations.ports.import_records import FailedItem, ImportRunSummary
from pin_identity.operations.ports.pruning import PruneResult
from pin_identity.operations.ports.replica import ReplicaTransaction
from pin_identity.operations.ports.talent_sources import SourceCheck
from pin_identity.operations.retention_admin import RetentionAdmin
from tests.support.clocks import ManualClock
from tests.support.memory_talent import MemoryImportStore, MemoryRunLock, MemorySource

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
WHO = Actor("http:alice", client="10.1.2.3")


def _run(status: RunStatus = RunStatus.RUNNING, *, listed: bool = True) -> ImportRun:
    return ImportRun(
        run_id=uuid.uuid4(),
        mode=ImportMode.API_PULL,
        status=status,
        tenant_filter=None,
        page_size=500,
        dry_run=False,
        correlation_id=uuid.uuid4(),
        started_at=NOW - timedelta(seconds=60),
        finished_at=None,
        companies=StageCounters(),
        users=StageCounters(),
        tenants_listed=listed,
        users_listed=listed,
    )


class MemoryRuns(MemoryImportStore):
    """The import store as operators see it: the runs given, and page counts, lease resets and a quarantine
    as each test sets them."""

    def __init__(self, *runs: ImportRun):
        super().__init__(runs={run.run_id: run for run in runs})
        self.progress_counts: dict[tuple[ImportStage, PageStatus], int] = {}
        self.items: list[FailedItem] = []

    def progress(self, run_id: UUID) -> PageProgress:
        return PageProgress(self.progress_counts)

    def request_cancel(self, run_id: UUID) -> bool:
        run = self.runs.get(run_id)
        return run is not None and run.status is RunStatus.RUNNING

    def reset_leases(self, run_id: UUID, now: datetime) -> int:
        return 2

    def failed_items(self, run_id: UUID | None) -> list[FailedItem]:
        return self.items

    def recent_runs(self, limit: int) -> list[ImportRunSummary]:
        return []  # the list is the adapter's query; test_console_reads covers the service's side


def _no_replica() -> AbstractContextManager[ReplicaTransaction]:
    raise AssertionError("no replay in these tests")


class World:
    def __init__(
        self, runs: MemoryRuns, lock: MemoryRunLock | None = None, source: MemorySource | None = None
    ):
        self.runs, self.lock, self.source = runs, lock or MemoryRunLock(), source or MemorySource()
        self.sources_opened = 0
        self.operations = ImportOperations(
            runs, lambda: self.lock, self._source, _no_replica, ManualClock(NOW), summaries=runs
        )

    def _source(self, mode: ImportMode) -> SourceCheck:
        self.sources_opened += 1
        return self.source


@contextmanager
def audit() -> Iterator[list[dict[str, Any]]]:
    with capture_logs() as logs:
        lines: list[dict[str, Any]] = []
        yield lines
    lines.extend(line for line in logs if line["event"] == "admin-action")


# ---------------------------------------------------------------- starting a run


def test_start_creates_a_run_takes_the_lock_once_and_lets_go_of_it() -> None:
    world = World(MemoryRuns())
    with audit() as lines:
        run = world.operations.start(ImportRequest(ImportMode.API_PULL), who=WHO)
    assert (world.lock.acquisitions, world.lock.releases) == (1, 1)
    assert world.source.closed
    assert [(a["action"], a["who"], a["client"], a["run_id"]) for a in lines] == [
        ("talent-import-start", "http:alice", "10.1.2.3", str(run.run_id))
    ]


def test_start_never_resumes_a_running_run() -> None:
    running = _run()
    world = World(MemoryRuns(running))
    with audit() as lines, pytest.raises(ImportRefusedError) as refused:
        world.operations.start(ImportRequest(ImportMode.API_PULL), who=WHO)
    assert refused.value.code is ImportErrorCode.ALREADY_RUNNING
    assert (world.lock.releases, lines) == (1, [])
    assert (world.sources_opened, world.source.closed) == (1, True)  # opened first, closed on the refusal


def test_start_while_another_process_holds_the_lock_names_the_holder() -> None:
    world = World(MemoryRuns(), MemoryRunLock(taken_by_another=True))
    with pytest.raises(ImportRefusedError, match="talent-import elsewhere") as refused:
        world.operations.start(ImportRequest(ImportMode.API_PULL), who=WHO)
    assert refused.value.code is ImportErrorCode.ALREADY_RUNNING
    assert (world.sources_opened, world.source.closed) == (1, True)


def test_run_keeps_the_lock_for_its_caller_and_an_unavailable_source_refuses() -> None:
    world = World(MemoryRuns())
    with audit() as lines:
        run, lock = world.operations.run(ImportRequest(ImportMode.API_PULL), who=WHO)
    assert lock is world.lock and (lock.acquisitions, lock.releases) == (1, 0)
    assert [a["action"] for a in lines] == ["talent-import-run"] and lines[0]["run_id"] == str(run.run_id)

    down = World(MemoryRuns(), source=MemorySource(unavailable=True))
    with audit() as refused_lines, pytest.raises(ImportRefusedError) as refused:
        down.operations.run(ImportRequest(ImportMode.API_PULL), who=WHO)
    assert refused.value.code is ImportErrorCode.SOURCE_UNAVAILABLE
    assert (down.lock.releases, down.source.closed, refused_lines) == (1, True, [])


def test_a_source_that_cannot_be_opened_refuses_as_unavailable_whoever_holds_the_lock() -> None:
    """`talent-import run --mode topic-replay` with the broker down exits 4 (SOURCE_UNAVAILABLE), not 3
    because another process happens to hold the lock: the source is opened before the lock is asked."""

    class Unreachable(World):
        def _source(self, mode: ImportMode) -> SourceCheck:
            raise SourceUnavailableError("PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS: the broker does not answer")

    world = Unreachable(MemoryRuns(), MemoryRunLock(taken_by_another=True))
    for action in (world.operations.run, world.operations.start):
        with pytest.raises(ImportRefusedError) as refused:
            action(ImportRequest(ImportMode.TOPIC_REPLAY), who=WHO)
        assert refused.value.code is ImportErrorCode.SOURCE_UNAVAILABLE
    assert world.lock.acquisitions == 0


# ---------------------------------------------------------------- watching and steering


def test_the_report_of_a_running_run_has_an_eta_from_the_pace_of_done_pages() -> None:
    running = _run()
    runs = MemoryRuns(running)
    runs.progress_counts = {
        (ImportStage.USERS, PageStatus.DONE): 3,
        (ImportStage.USERS, PageStatus.PENDING): 3,
    }
    view = World(runs).operations.report(running.run_id)
    assert view.eta_seconds == 60.0  # 3 pages in 60 s, 3 to go
    assert (view.duration_ms, view.page_count(ImportStage.USERS, PageStatus.DONE)) == (60_000, 3)
    assert World(MemoryRuns(_run(listed=False))).operations.report().eta_seconds is None  # still listing


def test_unknown_runs_are_not_found_and_only_a_running_run_is_cancelled() -> None:
    done = _run(RunStatus.COMPLETED)
    operations = World(MemoryRuns(done)).operations
    with audit() as lines:
        for action in (
            lambda: operations.report(uuid.uuid4()),
            lambda: operations.cancel(uuid.uuid4(), who=WHO),
            lambda: operations.reset_leases(uuid.uuid4(), who=WHO),
            lambda: operations.failed_items(uuid.uuid4()),
        ):
            with pytest.raises(NotFoundError):
                action()
        with pytest.raises(ImportNotRunningError, match="is Completed"):
            operations.cancel(done.run_id, who=WHO)
    assert lines == []
    with pytest.raises(NotFoundError, match="no import run yet"):
        World(MemoryRuns()).operations.report()


def test_cancel_and_reset_leases_each_write_one_audit_line() -> None:
    running = _run()
    operations = World(MemoryRuns(running)).operations
    with audit() as lines:
        operations.cancel(running.run_id, who=WHO)
        assert operations.reset_leases(running.run_id, who=WHO) == 2
    assert [a["action"] for a in lines] == ["talent-import-cancel", "talent-import-reset-leases"]
    assert lines[1]["pages"] == 2


# ---------------------------------------------------------------- fan-out and retention


class MemoryTasks:
    def __init__(
        self, outcome: TaskReplay, status: FanOutTaskStatus | None, discarded: FanOutTaskView | None = None
    ):
        self.outcome, self.status, self.discarded = outcome, status, discarded

    def list_tasks(self, status: FanOutTaskStatus | None, limit: int) -> list[FanOutTaskView]:
        return []

    def replay(self, task_id: UUID, now: datetime) -> TaskReplay:
        return self.outcome

    def discard(self, task_id: UUID) -> FanOutTaskView | None:
        return self.discarded

    def task_status(self, task_id: UUID) -> FanOutTaskStatus | None:
        return self.status

    def newer_announcement(self, role_id: UUID, role_version: int) -> NewerAnnouncement:
        return NewerAnnouncement(role_version, None, None, failed=False)  # nothing since


@pytest.mark.parametrize(
    ("outcome", "status", "error"),
    [
        (TaskReplay.NOT_FAILED, None, NotFoundError),
        (TaskReplay.NOT_FAILED, FanOutTaskStatus.PENDING, ConflictError),
        (TaskReplay.ROLE_HAS_PENDING_TASK, FanOutTaskStatus.FAILED, ConflictError),
    ],
)
def test_a_task_that_cannot_be_replayed_is_an_error_without_audit(
    outcome: TaskReplay, status: FanOutTaskStatus | None, error: type[Exception]
) -> None:
    with audit() as lines, pytest.raises(error):
        FanOutAdmin(MemoryTasks(outcome, status), ManualClock(NOW)).replay(uuid.uuid4(), who=WHO)
    assert lines == []


def test_a_replayed_task_is_audited_once() -> None:
    task_id = uuid.uuid4()
    with audit() as lines:
        FanOutAdmin(MemoryTasks(TaskReplay.REPLAYED, None), ManualClock(NOW)).replay(task_id, who=WHO)
    assert [(a["action"], a["task_id"]) for a in lines] == [("fanout-replay", str(task_id))]


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (None, NotFoundError),
        (FanOutTaskStatus.PENDING, ConflictError),
        (FanOutTaskStatus.COMPLETED, ConflictError),
    ],
)
def test_a_task_that_cannot_be_discarded_is_an_error_without_audit(
    status: FanOutTaskStatus | None, error: type[Exception]
) -> None:
    tasks = MemoryTasks(TaskReplay.NOT_FAILED, status, discarded=None)
    with audit() as lines, pytest.raises(error):
        FanOutAdmin(tasks, ManualClock(NOW)).discard(uuid.uuid4(), who=WHO)
    assert lines == []


def test_a_discarded_task_is_audited_once_with_what_it_was() -> None:
    task = FanOutTaskView(
        task_id=uuid.uuid4(),
        role_id=uuid.uuid4(),
        company_id=None,
        role_version=4,
        reason="RolePermissionsChanged",
        status=FanOutTaskStatus.FAILED,
        cursor=uuid.uuid4(),
        processed_count=1500,
        attempt_count=5,
        lease_expires_at=None,
        created_at=NOW,
        started_at=NOW,
        completed_at=None,
        updated_at=NOW,
        last_error="OperationalError: the broker refused the batch",
    )
    tasks = MemoryTasks(TaskReplay.NOT_FAILED, FanOutTaskStatus.FAILED, discarded=task)
    with audit() as lines:
        assert FanOutAdmin(tasks, ManualClock(NOW)).discard(task.task_id, who=WHO).task == task
    assert [
        (a["action"], a["task_id"], a["role_id"], a["role_version"], a["processed_count"], a["cursor"])
        for a in lines
    ] == [("fanout-discard", str(task.task_id), str(task.role_id), 4, 1500, str(task.cursor))]
    assert "last_error" not in lines[0], "an error's text stays in the database, out of the audit trail"


def test_prune_cuts_off_at_now_minus_the_age() -> None:
    cutoffs: list[datetime] = []

    class Retention:
        def prune(self, cutoff: datetime) -> PruneResult:
            cutoffs.append(cutoff)
            return PruneResult(fanout_tasks=1, import_runs=2, quarantine_payloads=3)

    with audit() as lines:
        pruned = RetentionAdmin(Retention(), ManualClock(NOW)).prune(timedelta(days=30), who=WHO)
    assert cutoffs == [NOW - timedelta(days=30)] and pruned.import_runs == 2
    assert [(a["action"], a["older_than_s"], a["quarantine_payloads"]) for a in lines] == [
        ("maintenance-prune", 30 * 86_400, 3)
    ]

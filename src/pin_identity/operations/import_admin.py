"""The operator's side of the Talent initial import: start (or resume) a run, watch it, cancel it, make its
stuck pages claimable, and the quarantine (a run's, or the continuous consumer's): list it, replay it.

The CLI and the HTTP API both call these; each action writes its one audit line here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from uuid import UUID

from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import ImportNotRunningError, NotFoundError, SourceUnavailableError
from pin_identity.domain.import_run import (
    TRUNCATED_SOURCE_SHARE,
    ImportAlreadyRunningError,
    ImportMode,
    ImportRequest,
    ImportResumeMismatchError,
    ImportRun,
    ImportSourceIncompleteError,
    ImportSourceUnavailableError,
    PageProgress,
    RunStatus,
)
from pin_identity.observability.logging import get_logger
from pin_identity.observability.tracing import write_import_run_span
from pin_identity.operations.action_log import Actor, admin_action
from pin_identity.operations.context import Context
from pin_identity.operations.documents import ImportRunReport, ReplayResult
from pin_identity.operations.ports.import_records import (
    FailedItem,
    ImportRuns,
    ImportRunSummary,
    RunLock,
    RunSummaries,
)
from pin_identity.operations.ports.replica import ReplicaTransactions
from pin_identity.operations.ports.talent_sources import SourceCheck
from pin_identity.operations.talent_replica import replay_quarantined

log = get_logger("talent-import")


def start_run(
    store: ImportRuns,
    lock: RunLock,
    sources: Callable[[ImportMode], SourceCheck],
    request: ImportRequest,
    now: datetime,
    *,
    resume: bool = True,
) -> ImportRun:
    """The one way to start an import run (`talent-import run`, the HTTP API, the demo): open the request's
    source (a source that cannot be opened is SOURCE_UNAVAILABLE whoever holds the lock); take the run lock;
    refuse a Running run that differs from the request (with `resume=False`, any Running run); check the
    source; resume the Running run or create a new one. The lock stays held (released on a refusal): the
    caller orchestrates the run or lets go of the lock."""
    with _opened(sources, request.mode) as source:
        _take(lock)
        try:
            running = _running(store, request, resume=resume)
            return _resume_or_create(store, source, request, running, now)
        except BaseException:
            lock.release()
            raise


def _take(lock: RunLock) -> None:
    if not lock.try_acquire():
        raise ImportAlreadyRunningError(f"another run holds the lock ({lock.holder()})")


def _running(store: ImportRuns, request: ImportRequest, *, resume: bool) -> ImportRun | None:
    """The Running run the request resumes, if any."""
    running = store.running_run()
    if running is None:
        return None
    if not resume:
        raise ImportAlreadyRunningError(f"run {running.run_id} is Running")
    if differences := request.differs_from(running):
        raise ImportResumeMismatchError(
            f"run {running.run_id} is Running with {', '.join(differences)}; resume it with the same options",
        )
    return running


@contextmanager
def _opened(sources: Callable[[ImportMode], SourceCheck], mode: ImportMode) -> Iterator[SourceCheck]:
    try:
        source = sources(mode)
    except SourceUnavailableError as exc:
        raise ImportSourceUnavailableError(str(exc)) from None
    try:
        yield source
    finally:
        source.close()


def _resume_or_create(
    store: ImportRuns, source: SourceCheck, request: ImportRequest, running: ImportRun | None, now: datetime
) -> ImportRun:
    _check_source(source)
    if running is not None:
        log.info("import-resumed", run_id=str(running.run_id), correlation_id=str(running.correlation_id))
        return running
    if not request.force:
        _guard_against_truncated_source(store, source, request.tenant_filter)
    run = store.create_run(request, request.correlation_id or uuid.uuid4(), now)
    log.info(
        "import-started",
        run_id=str(run.run_id),
        mode=run.mode.value,
        dry_run=run.dry_run,
        page_size=run.page_size,
        tenant_filter=str(run.tenant_filter) if run.tenant_filter else None,
        correlation_id=str(run.correlation_id),
    )
    return run


def _check_source(source: SourceCheck) -> None:
    try:
        source.check()
    except SourceUnavailableError as exc:
        raise ImportSourceUnavailableError(str(exc)) from None


def _guard_against_truncated_source(
    store: ImportRuns, source: SourceCheck, tenant_filter: UUID | None
) -> None:
    """An empty or cut-off source must never pass for the truth: refuse when it lists markedly fewer companies
    than the replica already holds from Talent within the run's scope."""
    held = store.replica_company_count(tenant_filter)
    try:
        listed = source.count_companies(tenant_filter)
    except SourceUnavailableError as exc:
        raise ImportSourceUnavailableError(str(exc)) from None
    if listed is not None and held and listed < held * TRUNCATED_SOURCE_SHARE:
        raise ImportSourceIncompleteError(
            f"the source lists {listed} companies, the replica holds {held} from Talent "
            f"(under {TRUNCATED_SOURCE_SHARE:.0%}); rerun with --force if this is intended",
        )


def _started(run: ImportRun) -> dict[str, object]:
    return {
        "run_id": str(run.run_id),
        "mode": run.mode.value,
        "dry_run": run.dry_run,
        "correlation_id": str(run.correlation_id),
    }


class ImportOperations:
    """What an operator does with import runs and quarantines, over the stores' ports. `sources` opens the
    source of a mode; it raises SourceUnavailableError when that source cannot be reached, and
    SourceNotConfiguredError when this process has no way to read it. `summaries` lists the runs."""

    def __init__(
        self,
        runs: ImportRuns,
        locks: Callable[[], RunLock],
        sources: Callable[[ImportMode], SourceCheck],
        replica: ReplicaTransactions,
        clock: Clock,
        *,
        summaries: RunSummaries,
    ):
        self._runs, self._locks, self._sources = runs, locks, sources
        self._replica, self._clock, self._summaries = replica, clock, summaries

    # ---------------------------------------------------------------- starting a run

    def run(self, request: ImportRequest, *, who: Actor) -> tuple[ImportRun, RunLock]:
        """`talent-import run`: start or resume the run and keep its lock: the caller orchestrates the run."""
        lock = self._locks()
        run = start_run(self._runs, lock, self._sources, request, self._clock.now())
        admin_action("talent-import-run", who, **_started(run))
        return run, lock

    def start(self, request: ImportRequest, *, who: Actor) -> ImportRun:
        """Create a run (never resume one: a Running run is ALREADY_RUNNING) and let go of the lock at once: a
        `worker` running the `talent-import` job takes it and orchestrates the run."""
        lock = self._locks()
        run = start_run(self._runs, lock, self._sources, request, self._clock.now(), resume=False)
        lock.release()
        admin_action("talent-import-start", who, **_started(run))
        return run

    # ---------------------------------------------------------------- watching and steering a run

    def recent_runs(self, limit: int = 20) -> list[ImportRunSummary]:
        """The newest runs first, with their counters and quarantine size."""
        return self._summaries.recent_runs(limit)

    def report(self, run_id: UUID | None = None) -> ImportRunReport:
        """A run (the newest when None) with its pages by stage and status, an ETA and the lock holder."""
        run = self.existing_run(run_id) if run_id else self._runs.latest_run()
        if run is None:
            raise NotFoundError("there is no import run yet")

        progress = self._runs.progress(run.run_id)
        return ImportRunReport.of_run(run, progress, self._locks().holder(), self._clock.now())

    def pages(self, run_id: UUID) -> PageProgress:
        """The run's pages by stage and status (what a progress bar shows)."""
        return self._runs.progress(run_id)

    def existing_run(self, run_id: UUID) -> ImportRun:
        """An unknown id is an error (IDENTITY_NOT_FOUND), never an empty answer or a no-op."""
        run = self._runs.load_run(run_id)
        if run is None:
            raise NotFoundError(f"import run {run_id} does not exist")
        return run

    def cancel(self, run_id: UUID, *, who: Actor) -> None:
        """Running -> Cancelled at once: pages already claimed finish, Done pages are kept."""
        if not self._runs.request_cancel(run_id):
            run = self.existing_run(run_id)
            raise ImportNotRunningError(f"import run {run_id} is {run.status.value}, not Running")
        admin_action("talent-import-cancel", who, run_id=str(run_id))
        log.info("import-cancelled", run_id=str(run_id), by=who.who)
        if (cancelled := self._runs.load_run(run_id)) is not None:
            ended_at = cancelled.finished_at or self._clock.now()
            write_import_run_span(cancelled, RunStatus.CANCELLED, ended_at)

    def reset_leases(self, run_id: UUID, *, who: Actor) -> int:
        """The runbook's "stuck" case: every InProgress page of the run becomes claimable now."""
        self.existing_run(run_id)
        pages = self._runs.reset_leases(run_id, self._clock.now())
        admin_action("talent-import-reset-leases", who, run_id=str(run_id), pages=pages)
        return pages

    # ---------------------------------------------------------------- the quarantine

    def failed_items(self, run_id: UUID | None) -> list[FailedItem]:
        """A run's quarantine (the run must exist) or, for None, the continuous consumer's; oldest first."""
        if run_id is not None:
            self.existing_run(run_id)
        return self._runs.failed_items(run_id)

    def replay_failed(
        self, run_id: UUID | None, item_ids: Sequence[UUID] | None, *, who: Actor
    ) -> ReplayResult:
        """Apply quarantined items again (all when `item_ids` is None) after the operator fixed their cause;
        those that apply leave the quarantine."""
        if run_id is not None:
            self.existing_run(run_id)
        replayed = replay_quarantined(
            self._replica, Context.fresh(self._clock), run_id=run_id, item_ids=item_ids
        )
        action = "talent-import-replay-failed" if run_id else "talent-sync-replay-failed"
        items = [str(item) for item in item_ids or []]
        admin_action(action, who, run_id=str(run_id) if run_id else None, items=items)
        batch = replayed.batch
        return ReplayResult(
            applied=batch.applied,
            skipped=batch.skipped,
            failed=batch.failed,
            not_replayable=replayed.without_snapshot,
        )

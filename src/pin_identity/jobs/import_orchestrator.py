"""The import's orchestration, done by the one process holding the run lock: it lists the source into pages
ahead of the appliers (Tenants, then, once every Tenants page is Done, Users: the barrier), ends the run, and
hands a complete replay over to the continuous consumer."""

from __future__ import annotations

from uuid import UUID

from pin_identity.config import ImportSettings
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import SourceRejectedError, SourceUnavailableError
from pin_identity.domain.import_run import (
    ImportErrorCode,
    ImportMode,
    ImportRun,
    PageStatus,
    RunEnding,
    RunStatus,
)
from pin_identity.domain.talent import ImportStage
from pin_identity.jobs.talent_import_observer import ImportObserver
from pin_identity.observability.logging import describe_error
from pin_identity.observability.tracing import write_import_run_span, write_import_stage_span
from pin_identity.operations.documents import ImportResult
from pin_identity.operations.ports.import_records import ImportStore, RunLock
from pin_identity.operations.ports.talent_sources import TalentSource


class ImportOrchestrator:
    """The orchestration of runs by this process, while it holds their lock (see the module's docstring)."""

    def __init__(
        self,
        store: ImportStore,
        lock: RunLock,
        settings: ImportSettings,
        clock: Clock,
        observer: ImportObserver | None = None,
    ):
        self._store, self._lock, self._settings, self._clock = store, lock, settings, clock
        self._observer = observer or ImportObserver()
        self.orchestrating = False
        self._planning_failures = 0
        self._plan_not_before = 0.0
        self._next_lock_try = 0.0
        self._stages_ended: set[tuple[UUID, ImportStage]] = set()

    # ------------------------------------------------------------ the lock

    def take(self, run: ImportRun) -> None:
        """Orchestrate `run`, whose lock this process already holds (`talent-import run`)."""
        self.orchestrating = True
        self._observer.orchestrating(run)

    def lead(self, run: ImportRun) -> bool:
        """Whether this process orchestrates `run` now: it steps down when the lock's session died, and takes
        the lock when nobody holds it."""
        if self.orchestrating and not self._lock.held():
            self.orchestrating = False  # the session died: another process may orchestrate by now
            self._observer.orchestration_lost(run)
        if not self.orchestrating and self._may_try_lock() and self._lock.try_acquire():
            self.take(run)
            self._observer.orchestration_taken(run)
        return self.orchestrating

    def step_down(self) -> None:
        if self.orchestrating:
            self._lock.release()
            self.orchestrating = False
        self._observer.stepped_down()

    def _may_try_lock(self) -> bool:
        """Each try opens a session: a helper asks every few seconds, not at every page."""
        now = self._clock.monotonic()
        if now < self._next_lock_try:
            return False
        self._next_lock_try = now + self._settings.lock_retry_s
        return True

    # ------------------------------------------------------------ planning

    def plan_ahead(self, run: ImportRun, source: TalentSource) -> bool:
        """List until a few pages wait ahead of the appliers: with one page planned per page applied, the
        orchestrator would consume its own listing and other processes would never find work."""
        planned = False
        current: ImportRun | None = run
        while current is not None and current.status is RunStatus.RUNNING and self._plan(current, source):
            planned = True
            if (
                self._store.progress(run.run_id).count(status=PageStatus.PENDING)
                >= self._settings.plan_ahead_pages
            ):
                break
            current = self._store.load_run(run.run_id)
        return planned

    def _plan(self, run: ImportRun, source: TalentSource) -> bool:
        stage = run.planning_stage
        if stage is None or self._clock.monotonic() < self._plan_not_before:
            return False
        if stage is ImportStage.USERS and not self._tenants_done(run):
            return False  # the barrier: no Users page before every Tenants page is Done
        try:
            step = source.plan(stage, run.plan_cursor, run.plan_page_no, run.page_size, run.tenant_filter)
        except SourceRejectedError as exc:
            self.end(run, RunEnding.failed(ImportErrorCode.SOURCE_UNAVAILABLE, str(exc)))
            return True
        except SourceUnavailableError as exc:
            return self._planning_failed(run, exc)
        self._planning_failures, self._plan_not_before = 0, 0.0
        if not self._store.add_planned_pages(run, stage, step):
            return False  # another view of the run moved on meanwhile: the next loop plans from the fresh one
        if step.complete:
            self._observer.stage_planned(run, stage, self._store.progress(run.run_id).count(stage))
        return True

    def _tenants_done(self, run: ImportRun) -> bool:
        progress = self._store.progress(run.run_id)
        done = progress.count(ImportStage.TENANTS, PageStatus.DONE) == progress.count(ImportStage.TENANTS)
        if done and run.plan_page_no == 0:  # until the first Users page is listed
            self._stage_completed(run, ImportStage.TENANTS)
        return done

    def _stage_completed(self, run: ImportRun, stage: ImportStage) -> None:
        """Said once per stage by this process (planning may look again before the first Users page is
        listed), with the stage's span in the run's trace."""
        if (run.run_id, stage) in self._stages_ended:
            return
        self._stages_ended.add((run.run_id, stage))
        self._observer.stage_completed(run, stage)
        times = self._store.stage_times(run.run_id, stage)
        if times is not None:
            write_import_stage_span(run, stage, times)

    def _planning_failed(self, run: ImportRun, exc: Exception) -> bool:
        self._planning_failures += 1
        if self._planning_failures >= self._settings.max_planning_failures:
            self.end(run, RunEnding.failed(ImportErrorCode.PLANNING_FAILED, describe_error(exc)))
            return True
        delay = self._settings.backoff.delay(self._planning_failures)
        self._plan_not_before = self._clock.monotonic() + delay
        self._observer.planning_retry(run, exc, delay)
        return False

    # ------------------------------------------------------------ the end

    def finish_if_done(self, run: ImportRun, source: TalentSource) -> bool:
        """End the run once no page is open: Failed if a page failed, else Completed when both stages are
        listed (a complete replay of every company first hands its offsets to the consumer)."""
        current = self._store.load_run(run.run_id)
        if current is None or current.status is not RunStatus.RUNNING:
            return False
        progress = self._store.progress(run.run_id)
        if progress.open_pages():
            return False
        if failed := progress.count(status=PageStatus.FAILED):
            self.end(current, RunEnding.failed(ImportErrorCode.PAGES_FAILED, f"{failed} pages failed"))
            return True
        if current.planning_stage is not None:
            return False
        self._stage_completed(run, ImportStage.USERS)
        if current.mode is ImportMode.TOPIC_REPLAY and not current.dry_run and current.tenant_filter is None:
            self._hand_over(current, source)
        self.end(current, RunEnding.completed())
        return True

    def _hand_over(self, run: ImportRun, source: TalentSource) -> None:
        cursors = [c for stage in ImportStage for c in self._store.page_cursors(run.run_id, stage)]
        try:
            source.handover(cursors)
        except Exception as exc:  # the replay is complete either way; the consumer re-reads from its offsets
            self._observer.handover_failed(run, exc)

    def cancel(self, run: ImportRun) -> None:
        now = self._clock.now()
        if self._store.finish_run(run.run_id, RunEnding.cancelled(), now):
            self._observer.cancelled(run)
            write_import_run_span(run, RunStatus.CANCELLED, now)

    def end(self, run: ImportRun, ending: RunEnding) -> None:
        """Completed or Failed, once: a run another process ended meanwhile stays as it ended."""
        now = self._clock.now()
        if not self._store.finish_run(run.run_id, ending, now):
            return
        ended = self._store.load_run(run.run_id) or run
        self._observer.ended(run, ending, ImportResult.of(ended, now))
        write_import_run_span(run, ending.status, now)

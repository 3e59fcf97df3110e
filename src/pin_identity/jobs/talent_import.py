"""talent-initial-import: the bootstrap of the Talent replica, in leased pages any process may apply.

Roles. The process holding the run lock (the one that ran `talent-import run`, or a `worker` that picked up a
run created over HTTP) orchestrates: it lists the source into pages (Tenants, then after every Tenants page
is Done, Users: the barrier) and ends the run. Every process running the job, orchestrator included, claims
one page at a time, reads it from Talent outside any transaction, and applies it in one transaction with the
same apply logic as the continuous consumer: replicas, default roles, quarantine, page Done, run counters and
outbox events commit together.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from pin_identity.domain.backoff import Backoff
from pin_identity.domain.talent import ImportStage, ItemResult, RawSnapshot
from pin_identity.domain.talent_import import (
    TRUNCATED_SOURCE_SHARE,
    ImportErrorCode,
    ImportMode,
    ImportPage,
    ImportRefusedError,
    ImportRequest,
    ImportRun,
    PageStatus,
    RunStatus,
    StageCounters,
)
from pin_identity.jobs.ports import (
    ImportPageTransaction,
    ImportStore,
    LeaseLostError,
    RunLock,
    SourceNotConfiguredError,
    SourceRejectedError,
    SourceUnavailableError,
    StopSignal,
    TalentSource,
)
from pin_identity.jobs.replica_outcomes import record_outcome
from pin_identity.observability import metrics
from pin_identity.observability.logging import describe_error, get_logger
from pin_identity.operations.identity import Context
from pin_identity.operations.talent_replica import ApplyOptions, BatchOutcome, SourceItem, apply_snapshots

log = get_logger("talent-import")


@dataclass(frozen=True)
class ImportSettings:
    page_lease_s: float = 600
    max_page_attempts: int = 5
    idle_wait_s: float = 0.2
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    max_planning_failures: int = 8
    plan_ahead_pages: int = 8
    lock_retry_s: float = 5.0

    @property
    def backoff(self) -> Backoff:
        """The wait after a failed page attempt or planning step."""
        return Backoff(base_s=self.backoff_base_s, cap_s=self.backoff_max_s)


def start_run(
    store: ImportStore, lock: RunLock, source: TalentSource, request: ImportRequest, now: datetime
) -> ImportRun:
    """Take the run lock, then resume the Running run or validate and create a new one. The lock stays held
    (released on a refusal): the caller orchestrates the run."""
    if not lock.try_acquire():
        raise ImportRefusedError(
            ImportErrorCode.ALREADY_RUNNING, f"another run holds the lock ({lock.holder()})"
        )
    try:
        return _resume_or_create(store, source, request, now)
    except BaseException:
        lock.release()
        raise


def _resume_or_create(
    store: ImportStore, source: TalentSource, request: ImportRequest, now: datetime
) -> ImportRun:
    running = store.running_run()
    if running is not None and (differences := request.differs_from(running)):
        raise ImportRefusedError(
            ImportErrorCode.RESUME_MISMATCH,
            f"run {running.run_id} is Running with {', '.join(differences)}; resume it with the same options",
        )
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


def _check_source(source: TalentSource) -> None:
    try:
        source.check()
    except SourceUnavailableError as exc:
        raise ImportRefusedError(ImportErrorCode.SOURCE_UNAVAILABLE, str(exc)) from None


def _guard_against_truncated_source(
    store: ImportStore, source: TalentSource, tenant_filter: UUID | None
) -> None:
    """An empty or cut-off source must never pass for the truth: refuse when it lists markedly fewer companies
    than the replica already holds from Talent within the run's scope."""
    held = store.replica_company_count(tenant_filter)
    try:
        listed = source.count_companies(tenant_filter)
    except SourceUnavailableError as exc:
        raise ImportRefusedError(ImportErrorCode.SOURCE_UNAVAILABLE, str(exc)) from None
    if listed is not None and held and listed < held * TRUNCATED_SOURCE_SHARE:
        raise ImportRefusedError(
            ImportErrorCode.SOURCE_INCOMPLETE,
            f"the source lists {listed} companies, the replica holds {held} from Talent "
            f"(under {TRUNCATED_SOURCE_SHARE:.0%}); rerun with --force if this is intended",
        )


@dataclass
class _PlanningBackoff:
    failures: int = 0
    not_before: float = 0.0


@dataclass
class TalentImportJob:
    """One process's part in import runs (see the module's docstring)."""

    store: ImportStore
    lock: RunLock
    sources: Callable[[ImportMode], TalentSource]
    settings: ImportSettings
    clock: Callable[[], datetime]
    orchestrating: bool = False
    _planning: _PlanningBackoff = field(default_factory=_PlanningBackoff)
    _open_sources: dict[ImportMode, TalentSource] = field(default_factory=dict)
    _unreadable: set[ImportMode] = field(default_factory=set)
    _next_lock_try: float = 0.0

    # ------------------------------------------------------------ entry points

    def run(self, stop: StopSignal, *, once: bool = False) -> None:
        """`worker --jobs talent-import`: help any Running run; orchestrate it when nobody else does."""
        try:
            while not stop.is_set():
                run = self.store.running_run()
                if run is None:
                    self._step_down()
                    if once:
                        return
                    stop.wait(self.settings.idle_wait_s * 10)
                    continue
                if not self.step(run) and not stop.is_set():
                    stop.wait(self.settings.idle_wait_s)
        finally:
            self._step_down()
            self.close()

    def drive(self, run: ImportRun, stop: StopSignal) -> ImportRun:
        """`talent-import run`: orchestrate and work on this run (its lock already held) until it ends.
        A stop signal (SIGTERM) cancels the run after the current page."""
        self.orchestrating = True
        self._started(run)
        try:
            while (current := self.store.load_run(run.run_id)) and current.status is RunStatus.RUNNING:
                if stop.is_set():
                    self._cancel(current)
                elif not self.step(current):
                    stop.wait(self.settings.idle_wait_s)
            return self.store.load_run(run.run_id) or run
        finally:
            self._step_down()
            self.close()

    def step(self, run: ImportRun) -> bool:
        """Plan a little and apply one page; True when anything moved."""
        if not self._can_read(run.mode):
            return False  # neither orchestrate nor take pages: other processes can, this one cannot
        if self.orchestrating and not self.lock.held():
            self.orchestrating = False  # the session died: another process may orchestrate by now
            log.warning("import-orchestration-lost", run_id=str(run.run_id))
        if not self.orchestrating and self._may_try_lock() and self.lock.try_acquire():
            self.orchestrating = True
            self._started(run)
            log.info("import-orchestration-taken", run_id=str(run.run_id))
        planned = self._plan_ahead(run) if self.orchestrating else False
        worked = self._work_one_page(run)
        ended = self._finish_if_done(run) if self.orchestrating else False
        return planned or worked or ended

    def close(self) -> None:
        for source in self._open_sources.values():
            source.close()
        self._open_sources.clear()

    # ------------------------------------------------------------ orchestration

    def _may_try_lock(self) -> bool:
        """Each try opens a session: a helper asks every few seconds, not at every page."""
        now = time.monotonic()
        if now < self._next_lock_try:
            return False
        self._next_lock_try = now + self.settings.lock_retry_s
        return True

    def _can_read(self, mode: ImportMode) -> bool:
        try:
            self._source(mode)
        except SourceNotConfiguredError as exc:
            if mode not in self._unreadable:
                self._unreadable.add(mode)
                log.warning("import-source-not-configured", mode=mode.value, error=str(exc))
            return False
        return True

    def _source(self, mode: ImportMode) -> TalentSource:
        if mode not in self._open_sources:
            self._open_sources[mode] = self.sources(mode)
        return self._open_sources[mode]

    def _started(self, run: ImportRun) -> None:
        metrics.import_running.set(1)
        metrics.import_run_started.set(run.started_at.timestamp())

    def _step_down(self) -> None:
        if self.orchestrating:
            self.lock.release()
            self.orchestrating = False
        metrics.import_running.set(0)

    def _plan_ahead(self, run: ImportRun) -> bool:
        """List until a few pages wait ahead of the appliers: with one page planned per page applied, the
        orchestrator would consume its own listing and other processes would never find work."""
        planned = False
        current: ImportRun | None = run
        while current is not None and current.status is RunStatus.RUNNING and self._plan_step(current):
            planned = True
            pending = self.store.progress(run.run_id).count(status=PageStatus.PENDING)
            if pending >= self.settings.plan_ahead_pages:
                break
            current = self.store.load_run(run.run_id)
        return planned

    def _plan_step(self, run: ImportRun) -> bool:
        stage = run.planning_stage
        if stage is None or time.monotonic() < self._planning.not_before:
            return False
        if stage is ImportStage.USERS and not self._tenants_done(run):
            return False  # the barrier: no Users page before every Tenants page is Done
        try:
            step = self._source(run.mode).plan(
                stage, run.plan_cursor, run.plan_page_no, run.page_size, run.tenant_filter
            )
        except SourceRejectedError as exc:
            self._end(run, RunStatus.FAILED, ImportErrorCode.SOURCE_UNAVAILABLE, str(exc))
            return True
        except SourceUnavailableError as exc:
            return self._planning_failed(run, exc)
        self._planning = _PlanningBackoff()
        if not self.store.add_planned_pages(run, stage, step):
            return False  # another view of the run moved on meanwhile: the next loop plans from the fresh one
        if step.complete:
            pages = self.store.progress(run.run_id).count(stage)
            log.info("stage-planned", run_id=str(run.run_id), stage=stage.value, pages=pages)
        return True

    def _tenants_done(self, run: ImportRun) -> bool:
        progress = self.store.progress(run.run_id)
        done = progress.count(ImportStage.TENANTS, PageStatus.DONE) == progress.count(ImportStage.TENANTS)
        if done and run.plan_page_no == 0:  # until the first Users page is listed
            log.info("stage-completed", run_id=str(run.run_id), stage=ImportStage.TENANTS.value)
        return done

    def _planning_failed(self, run: ImportRun, exc: Exception) -> bool:
        self._planning.failures += 1
        if self._planning.failures >= self.settings.max_planning_failures:
            self._end(run, RunStatus.FAILED, ImportErrorCode.PLANNING_FAILED, describe_error(exc))
            return True
        delay = self.settings.backoff.delay(self._planning.failures)
        self._planning.not_before = time.monotonic() + delay
        log.warning("import-planning-retry", run_id=str(run.run_id), error=describe_error(exc), delay_s=delay)
        return False

    def _finish_if_done(self, run: ImportRun) -> bool:
        current = self.store.load_run(run.run_id)
        if current is None or current.status is not RunStatus.RUNNING:
            return False
        progress = self.store.progress(run.run_id)
        if progress.open_pages():
            return False
        failed = progress.count(status=PageStatus.FAILED)
        if failed:
            self._end(current, RunStatus.FAILED, ImportErrorCode.PAGES_FAILED, f"{failed} pages failed")
            return True
        if current.planning_stage is not None:
            return False
        log.info("stage-completed", run_id=str(run.run_id), stage=ImportStage.USERS.value)
        if current.mode is ImportMode.TOPIC_REPLAY and not current.dry_run and current.tenant_filter is None:
            self._hand_over(current)
        self._end(current, RunStatus.COMPLETED)
        return True

    def _hand_over(self, run: ImportRun) -> None:
        cursors = [c for stage in ImportStage for c in self.store.page_cursors(run.run_id, stage)]
        try:
            self._source(run.mode).handover(cursors)
        except (
            Exception
        ) as exc:  # the replay is complete either way; the consumer then re-reads from its offsets
            log.warning("import-handover-failed", run_id=str(run.run_id), error=describe_error(exc))

    def _cancel(self, run: ImportRun) -> None:
        if self.store.finish_run(run.run_id, RunStatus.CANCELLED, self.clock()):
            log.info("import-cancelled", run_id=str(run.run_id), correlation_id=str(run.correlation_id))

    def _end(
        self, run: ImportRun, status: RunStatus, code: ImportErrorCode | None = None, error: str = ""
    ) -> None:
        if not self.store.finish_run(
            run.run_id, status, self.clock(), error_code=code.value if code else None, error=error or None
        ):
            return
        ended = self.store.load_run(run.run_id) or run
        event = "import-completed" if status is RunStatus.COMPLETED else "import-failed"
        result = {k: v for k, v in ended.result(self.clock()).items() if k != "runId"}
        log.info(
            event,
            run_id=str(run.run_id),
            correlation_id=str(run.correlation_id),
            error_code=code.value if code else None,
            error=error or None,
            **result,
        )

    # ------------------------------------------------------------ pages

    def _work_one_page(self, run: ImportRun) -> bool:
        """Claim one page of this run (only while it is Running) and apply it; the run's options never change,
        so the caller's view of it is enough."""
        now = self.clock()
        lease_until = now + timedelta(seconds=self.settings.page_lease_s)
        attempts = self.settings.max_page_attempts
        page = self.store.claim_page(uuid.uuid4(), now, lease_until, attempts, run.run_id)
        if page is None:
            return False
        log.info(
            "page-claimed",
            run_id=str(run.run_id),
            stage=page.stage.value,
            page_no=page.page_no,
            attempt=page.attempt,
        )
        started = time.perf_counter()
        try:
            batch = self._apply_page(run, page)
        except LeaseLostError:
            log.warning(
                "page-lease-lost", run_id=str(run.run_id), stage=page.stage.value, page_no=page.page_no
            )
            return True
        except SourceRejectedError as exc:
            self._end(run, RunStatus.FAILED, ImportErrorCode.SOURCE_UNAVAILABLE, str(exc))
            return True
        except Exception as exc:
            self._page_failed(run, page, exc)
            return True
        self._page_applied(run, page, batch, time.perf_counter() - started)
        return True

    def _apply_page(self, run: ImportRun, page: ImportPage) -> BatchOutcome:
        records = self._source(run.mode).read(page.stage, page.cursor, run.page_size, run.tenant_filter)
        now = self.clock()
        lease_until = now + timedelta(seconds=self.settings.page_lease_s)
        with self.store.page_transaction(page, now, lease_until) as tx:
            records = _in_scope(tx, run, page.stage, records)
            memory = tx.dry_run_memory(run.run_id) if run.dry_run else None
            options = ApplyOptions(run_id=run.run_id, dry_run=run.dry_run, memory=memory)
            ctx = Context(correlation_id=run.correlation_id, now=now)
            batch = apply_snapshots(tx, page.stage, [SourceItem(r) for r in records], ctx, options)
            counters = StageCounters(len(records), batch.applied, batch.skipped, batch.failed)
            tx.complete_page(page, counters, count_planned=run.mode is ImportMode.TOPIC_REPLAY)
            tx.commit()
        return batch

    def _page_applied(self, run: ImportRun, page: ImportPage, batch: BatchOutcome, seconds: float) -> None:
        metrics.observe_import_page_duration(seconds)
        metrics.import_pages_total.labels(stage=page.stage.value, status=PageStatus.DONE.value).inc()
        for outcome in batch.outcomes:
            record_outcome(outcome, metric=metrics.import_items_total, run_id=run.run_id)
            if outcome.result is ItemResult.FAILED and not run.dry_run:  # a dry run quarantines nothing
                metrics.import_failed_items_total.inc()
        log.info(
            "page-applied",
            run_id=str(run.run_id),
            stage=page.stage.value,
            page_no=page.page_no,
            items_applied=batch.applied,
            items_skipped=batch.skipped,
            items_failed=batch.failed,
            duration_ms=round(seconds * 1000, 1),
            correlation_id=str(run.correlation_id),
        )

    def _page_failed(self, run: ImportRun, page: ImportPage, exc: Exception) -> None:
        now = self.clock()
        delay = self.settings.backoff.delay(page.attempt)
        error = describe_error(exc)
        status = self.store.release_page(
            page,
            now,
            available_at=now + timedelta(seconds=delay),
            max_attempts=self.settings.max_page_attempts,
            error=error,
        )
        if status is PageStatus.FAILED:
            metrics.import_pages_total.labels(stage=page.stage.value, status=PageStatus.FAILED.value).inc()
        log.warning(
            "page-failed",
            run_id=str(run.run_id),
            stage=page.stage.value,
            page_no=page.page_no,
            attempt=page.attempt,
            final=status is PageStatus.FAILED,
            retry_in_s=None if status is PageStatus.FAILED else delay,
            error=error,
        )


def _in_scope(
    tx: ImportPageTransaction, run: ImportRun, stage: ImportStage, records: list[RawSnapshot]
) -> list[RawSnapshot]:
    """A filtered run applies one company and its users; a deleted user (a tombstone names no tenant) belongs
    to the scope when the replica has it under that company."""
    tenant = run.tenant_filter
    if tenant is None:
        return records
    if stage is ImportStage.TENANTS:
        return [r for r in records if _field(r, "tenantId", r.key) == str(tenant)]
    tombstoned = [uuid.UUID(r.key) for r in records if r.payload is None and r.key and _is_uuid(r.key)]
    ours = {str(u) for u in tx.talent_users_of_tenant(tenant, tombstoned)} if tombstoned else set()
    return [
        r
        for r in records
        if _field(r, "tenantId", None) == str(tenant) or (r.payload is None and r.key in ours)
    ]


def _field(record: RawSnapshot, name: str, default: str | None) -> str | None:
    if isinstance(record.payload, dict):
        value = record.payload.get(name)
        return str(value) if value is not None else None
    return default


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True

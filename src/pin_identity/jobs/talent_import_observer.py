"""What the initial import tells operators: the log lines (stable `event` names) and metrics of its
orchestration and of its page work, in one place.

The orchestrator and the page worker call one hook per thing that happened; tests subclass the observer to
wait on those hooks as signals instead of polling or sleeping.
"""

from __future__ import annotations

from pin_identity.domain.import_run import (
    ImportMode,
    ImportPage,
    ImportRun,
    PageStatus,
    RunEnding,
    RunStatus,
    StageCounters,
)
from pin_identity.domain.talent import ImportStage, ItemResult
from pin_identity.jobs.replica_outcomes import record_outcome
from pin_identity.observability import metrics
from pin_identity.observability.logging import describe_error, get_logger
from pin_identity.operations.documents import ImportResult
from pin_identity.operations.talent_replica import BatchOutcome

log = get_logger("talent-import")


class ImportObserver:
    # ------------------------------------------------------------ orchestration

    def source_not_configured(self, mode: ImportMode, exc: Exception) -> None:
        """This process cannot read the run's source: it leaves the run to the others (said once per mode)."""
        log.warning("import-source-not-configured", mode=mode.value, error=str(exc))

    def orchestrating(self, run: ImportRun) -> None:
        metrics.record_import_running(run.started_at)

    def orchestration_taken(self, run: ImportRun) -> None:
        log.info("import-orchestration-taken", run_id=str(run.run_id))

    def orchestration_lost(self, run: ImportRun) -> None:
        log.warning("import-orchestration-lost", run_id=str(run.run_id))

    def stepped_down(self) -> None:
        """This process orchestrates no run (any more, or there is none)."""
        metrics.record_import_running(None)

    def stage_planned(self, run: ImportRun, stage: ImportStage, pages: int) -> None:
        log.info("stage-planned", run_id=str(run.run_id), stage=stage.value, pages=pages)

    def stage_completed(self, run: ImportRun, stage: ImportStage) -> None:
        log.info("stage-completed", run_id=str(run.run_id), stage=stage.value)

    def planning_retry(self, run: ImportRun, exc: Exception, delay_s: float) -> None:
        log.warning(
            "import-planning-retry", run_id=str(run.run_id), error=describe_error(exc), delay_s=delay_s
        )

    def handover_failed(self, run: ImportRun, exc: Exception) -> None:
        log.warning("import-handover-failed", run_id=str(run.run_id), error=describe_error(exc))

    def step_failed(self, run: ImportRun | None, exc: Exception) -> None:
        """A step failed on the database (or on anything else unforeseen): the job waits and steps again."""
        run_id = str(run.run_id) if run is not None else None
        log.warning("import-step-failed", run_id=run_id, error=describe_error(exc))

    def left_running(self, run: ImportRun) -> None:
        log.info("import-stopped", run_id=str(run.run_id), correlation_id=str(run.correlation_id))

    def cancelled(self, run: ImportRun) -> None:
        log.info("import-cancelled", run_id=str(run.run_id), correlation_id=str(run.correlation_id))

    def ended(self, run: ImportRun, ending: RunEnding, result: ImportResult) -> None:
        """Completed or Failed, by this process; `result` is the run's report as the status API gives it."""
        log.info(
            "import-completed" if ending.status is RunStatus.COMPLETED else "import-failed",
            run_id=str(run.run_id),
            correlation_id=str(run.correlation_id),
            error_code=ending.error_code,
            error=ending.error,
            **result.model_dump(mode="json", exclude={"run_id"}),
        )

    # ------------------------------------------------------------ pages

    def page_claimed(self, run: ImportRun, page: ImportPage) -> None:
        log.info("page-claimed", **_where(run, page), attempt=page.attempt)

    def page_lease_lost(self, run: ImportRun, page: ImportPage) -> None:
        log.warning("page-lease-lost", **_where(run, page))

    def page_applied(
        self, run: ImportRun, page: ImportPage, batch: BatchOutcome, counters: StageCounters, seconds: float
    ) -> None:
        metrics.observe_import_page_duration(seconds)
        metrics.import_pages_total.labels(stage=page.stage.value, status=PageStatus.DONE.value).inc()
        # A dry run predicts: it quarantines, skips and conflicts with nothing, so it raises no signal of
        # those (TalentPhoneConflictsGrowing must not fire for a rehearsal); its page line has the counts.
        if not run.dry_run:
            for outcome in batch.outcomes:
                record_outcome(
                    outcome,
                    metric=metrics.import_items_total,
                    correlation_id=run.correlation_id,
                    run_id=run.run_id,
                    page_no=page.page_no,
                )
                if outcome.result is ItemResult.FAILED:
                    metrics.import_failed_items_total.inc()
        log.info(
            "page-applied",
            **_where(run, page),
            dry_run=run.dry_run,
            items_applied=counters.applied,
            items_skipped=counters.skipped,
            items_failed=counters.failed,
            duration_ms=round(seconds * 1000, 1),
        )

    def page_released(
        self, run: ImportRun, page: ImportPage, status: PageStatus | None, retry_in_s: float, error: str
    ) -> None:
        """A page that failed went back to Pending (tried again after `retry_in_s`) or, its attempts spent,
        to Failed (`status` None: its lease had run out, the page was no longer ours to release)."""
        final = status is PageStatus.FAILED
        if final:
            metrics.import_pages_total.labels(stage=page.stage.value, status=PageStatus.FAILED.value).inc()
        log.warning(
            "page-failed",
            **_where(run, page),
            attempt=page.attempt,
            final=final,
            retry_in_s=None if final else retry_in_s,
            error=error,
        )


def _where(run: ImportRun, page: ImportPage) -> dict[str, object]:
    """What every page line says: the run, its CorrelationId (CONTRACTS 4a: the import's correlation), the
    page."""
    return {
        "run_id": str(run.run_id),
        "correlation_id": str(run.correlation_id),
        "stage": page.stage.value,
        "page_no": page.page_no,
    }

"""An import observer that remembers which hooks the orchestrator and the page worker called, in order: what
operators would have seen, in words a test can compare."""

from __future__ import annotations

from pin_identity.domain.import_run import (
    ImportMode,
    ImportPage,
    ImportRun,
    PageStatus,
    RunEnding,
    StageCounters,
)
from pin_identity.domain.talent import ImportStage
from pin_identity.jobs.talent_import_observer import ImportObserver
from pin_identity.operations.documents import ImportResult
from pin_identity.operations.talent_replica import BatchOutcome


class RecordingImportObserver(ImportObserver):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def source_not_configured(self, mode: ImportMode, exc: Exception) -> None:
        self.calls.append(f"cannot read {mode.value}")

    def orchestrating(self, run: ImportRun) -> None:
        self.calls.append("orchestrating")

    def orchestration_taken(self, run: ImportRun) -> None:
        self.calls.append("lock taken")

    def orchestration_lost(self, run: ImportRun) -> None:
        self.calls.append("lock lost")

    def stepped_down(self) -> None:
        self.calls.append("stepped down")

    def stage_planned(self, run: ImportRun, stage: ImportStage, pages: int) -> None:
        self.calls.append(f"{stage.value} planned: {pages} pages")

    def stage_completed(self, run: ImportRun, stage: ImportStage) -> None:
        self.calls.append(f"{stage.value} completed")

    def planning_retry(self, run: ImportRun, exc: Exception, delay_s: float) -> None:
        self.calls.append(f"planning retry: {exc}")

    def handover_failed(self, run: ImportRun, exc: Exception) -> None:
        self.calls.append(f"handover failed: {exc}")

    def step_failed(self, run: ImportRun | None, exc: Exception) -> None:
        self.calls.append(f"step failed: {exc}")

    def cancelled(self, run: ImportRun) -> None:
        self.calls.append("cancelled")

    def ended(self, run: ImportRun, ending: RunEnding, result: ImportResult) -> None:
        status = ending.status.value
        self.calls.append(f"{status} {ending.code.value}" if ending.code else status)

    def page_claimed(self, run: ImportRun, page: ImportPage) -> None:
        self.calls.append(f"claimed {page.stage.value} {page.page_no}")

    def page_lease_lost(self, run: ImportRun, page: ImportPage) -> None:
        self.calls.append(f"lease lost {page.stage.value} {page.page_no}")

    def page_applied(
        self, run: ImportRun, page: ImportPage, batch: BatchOutcome, counters: StageCounters, seconds: float
    ) -> None:
        self.calls.append(
            f"applied {page.stage.value} {page.page_no}: {counters.applied} of {counters.planned}"
        )

    def page_released(
        self, run: ImportRun, page: ImportPage, status: PageStatus | None, retry_in_s: float, error: str
    ) -> None:
        self.calls.append(f"released {page.stage.value} {page.page_no}: {status} ({error})")

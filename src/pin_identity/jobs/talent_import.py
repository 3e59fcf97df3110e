"""talent-initial-import: the bootstrap of the Talent replica, in leased pages any process may apply.

Roles. The process holding the run lock (the one that ran `talent-import run`, or a `worker` that picked up a
run created over HTTP) orchestrates (import_orchestrator): it lists the source into pages and ends the run.
Every process running the job, orchestrator included, works on pages (import_pages): it claims one at a time,
reads it from Talent outside any transaction, and applies it in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pin_identity.config import ImportSettings
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import SourceNotConfiguredError, SourceRejectedError
from pin_identity.domain.import_run import (
    ImportErrorCode,
    ImportMode,
    ImportRun,
    RunEnding,
    RunStatus,
)
from pin_identity.jobs.import_orchestrator import ImportOrchestrator
from pin_identity.jobs.import_pages import PageWorker
from pin_identity.jobs.talent_import_observer import ImportObserver
from pin_identity.operations.ports.import_records import ImportStore, RunLock
from pin_identity.operations.ports.job_control import StopSignal
from pin_identity.operations.ports.talent_sources import TalentSource


@dataclass
class TalentImportJob:
    """One process's part in import runs (see the module's docstring)."""

    store: ImportStore
    lock: RunLock
    sources: Callable[[ImportMode], TalentSource]
    settings: ImportSettings
    clock: Clock
    observer: ImportObserver = field(default_factory=ImportObserver)
    _orchestrator: ImportOrchestrator = field(init=False)
    _pages: PageWorker = field(init=False)
    _open_sources: dict[ImportMode, TalentSource] = field(default_factory=dict)
    _unreadable: set[ImportMode] = field(default_factory=set)
    _failures: int = field(default=0, init=False)  # steps failed in a row

    def __post_init__(self) -> None:
        self._orchestrator = ImportOrchestrator(
            self.store, self.lock, self.settings, self.clock, self.observer
        )
        self._pages = PageWorker(self.store, self.settings, self.clock, self.observer)

    @property
    def orchestrating(self) -> bool:
        return self._orchestrator.orchestrating

    @orchestrating.setter
    def orchestrating(self, value: bool) -> None:
        self._orchestrator.orchestrating = value

    def run(self, stop: StopSignal, *, once: bool = False) -> None:
        """`worker --jobs talent-import`: help any Running run; orchestrate it when nobody else does."""
        try:
            while not stop.is_set():
                try:
                    run = self.store.running_run()
                except Exception as exc:  # the database is away (a failover): asked again after a wait
                    self._failed(None, exc)
                    stop.wait(self._pause())
                    continue
                if run is None:
                    self._orchestrator.step_down()
                    if once:
                        return
                    stop.wait(self.settings.idle_wait_s * 10)
                    continue
                if not self.step(run) and not stop.is_set():
                    stop.wait(self._pause())
        finally:
            self._orchestrator.step_down()
            self.close()

    def drive(self, run: ImportRun, stop: StopSignal, *, cancel: StopSignal | None = None) -> ImportRun:
        """`talent-import run`: orchestrate and work on this run (its lock already held) until it ends, or
        until `stop` (SIGTERM: an orchestrator stopping the pod, a node drained) after the current page: the
        run is left Running, its lock released and no page held, for the next process to resume. `cancel`
        (SIGINT, Ctrl-C at a terminal; set with `stop`) cancels the run after the current page instead."""
        self._orchestrator.take(run)
        current: ImportRun | None = run
        try:
            while (current := self._reload(current or run)) and current.status is RunStatus.RUNNING:
                if cancel is not None and cancel.is_set():
                    self._orchestrator.cancel(current)
                elif stop.is_set():
                    self.observer.left_running(current)
                    return current
                elif not self.step(current):
                    stop.wait(self._pause())
            return current or run
        finally:
            self._orchestrator.step_down()
            self.close()

    def _reload(self, run: ImportRun) -> ImportRun | None:
        """The run as stored (None once it is gone), or as last seen while the database is away."""
        try:
            return self.store.load_run(run.run_id)
        except Exception as exc:
            self.observer.step_failed(run, exc)  # the step with the run as last seen counts the failure
            return run

    def step(self, run: ImportRun) -> bool:
        """Plan a little and apply one page; True when anything moved. A database that is away (a failover,
        a restart) fails the step, not the process: the caller waits and steps again, and the lock and the
        page this process held are back in play with the session they lived in (the orchestrator takes the
        lock again, the page is claimed again, by whichever process is first)."""
        try:
            moved = self._step(run)
        except Exception as exc:
            self._failed(run, exc)
            return False
        self._failures = 0
        return moved

    def _failed(self, run: ImportRun | None, exc: Exception) -> None:
        self._failures += 1
        self.observer.step_failed(run, exc)

    def _pause(self) -> float:
        """The wait before the next step: short while the run moves or waits on others, backing off while the
        steps fail (a database away for a failover is asked a few times, not ten times a second)."""
        return self.settings.backoff.delay(self._failures) if self._failures else self.settings.idle_wait_s

    def _step(self, run: ImportRun) -> bool:
        source = self._source(run.mode)
        if source is None:
            return False  # neither orchestrate nor take pages: other processes can, this one cannot
        leading = self._orchestrator.lead(run)
        planned = leading and self._orchestrator.plan_ahead(run, source)
        try:
            worked = self._pages.work(run, source)
        except SourceRejectedError as exc:  # retrying will not help: the run fails, whoever saw it
            self._orchestrator.end(run, RunEnding.failed(ImportErrorCode.SOURCE_UNAVAILABLE, str(exc)))
            worked = True
        ended = leading and self._orchestrator.finish_if_done(run, source)
        return planned or worked or ended

    def close(self) -> None:
        for source in self._open_sources.values():
            source.close()
        self._open_sources.clear()

    def _source(self, mode: ImportMode) -> TalentSource | None:
        """The run's source, opened once; None when this process cannot read it."""
        if mode not in self._open_sources:
            try:
                self._open_sources[mode] = self.sources(mode)
            except SourceNotConfiguredError as exc:
                if mode not in self._unreadable:
                    self._unreadable.add(mode)
                    self.observer.source_not_configured(mode, exc)
                return None
        return self._open_sources[mode]

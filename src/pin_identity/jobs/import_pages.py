"""The import's page work, done by every process running the job: claim one page, read it from Talent outside
any transaction, apply it in one transaction with the same apply logic as the continuous consumer (replicas,
default roles, quarantine, the page Done and the run's counters commit together), or release it to be tried
again after a back-off."""

from __future__ import annotations

import uuid
from uuid import UUID

from pin_identity.config import ImportSettings
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import LeaseLostError, SourceRejectedError
from pin_identity.domain.import_run import (
    ImportMode,
    ImportPage,
    ImportRun,
    StageCounters,
)
from pin_identity.domain.talent import ImportStage, TalentItem
from pin_identity.jobs.talent_import_observer import ImportObserver
from pin_identity.observability.logging import describe_error
from pin_identity.observability.tracing import (
    Span,
    current_traceparent,
    failed,
    import_page_span,
    traced,
    tracer,
)
from pin_identity.operations.context import Context
from pin_identity.operations.ports.import_records import ImportPageTransaction, ImportStore
from pin_identity.operations.ports.replica import SourceItem
from pin_identity.operations.ports.talent_sources import TalentSource
from pin_identity.operations.talent_replica import ApplyOptions, BatchOutcome, apply_snapshots

_tracer = tracer("talent-import")


class PageWorker:
    """One process's page work (see the module's docstring)."""

    def __init__(
        self,
        store: ImportStore,
        settings: ImportSettings,
        clock: Clock,
        observer: ImportObserver | None = None,
    ):
        self._store, self._settings, self._clock = store, settings, clock
        self._lease = settings.lease_rules
        self._observer = observer or ImportObserver()

    def work(self, run: ImportRun, source: TalentSource) -> bool:
        """Claim one page of this run (only while it is Running) and apply it; False when none was free. The
        run's options never change, so the caller's view of it is enough. Talent refusing our credentials
        (SourceRejectedError) fails the run: that is the caller's to do."""
        now = self._clock.now()
        self._store.fail_exhausted(now, self._lease.max_attempts)
        page = self._store.claim(uuid.uuid4(), now, self._lease.until(now), run.run_id)
        if page is None:
            return False
        self._observer.page_claimed(run, page)
        with import_page_span(run, page) as span:
            self._work_on(run, page, source, span)
        return True

    def _work_on(self, run: ImportRun, page: ImportPage, source: TalentSource, span: Span) -> None:
        started = self._clock.monotonic()
        try:
            with traced(_tracer, "talent-import.read", {"stage": page.stage.value}) as read:
                items = source.read(page.stage, page.cursor, run.page_size, run.tenant_filter)
                read.set_attribute("items", len(items))
            batch, counters = self._apply(run, page, items)
        except LeaseLostError as exc:
            failed(span, exc)
            self._observer.page_lease_lost(run, page)
        except SourceRejectedError:
            raise
        except Exception as exc:
            failed(span, exc)
            self._release(run, page, exc)
        else:
            span.set_attributes(
                {
                    "itemsApplied": counters.applied,
                    "itemsSkipped": counters.skipped,
                    "itemsFailed": counters.failed,
                }
            )
            self._observer.page_applied(run, page, batch, counters, self._clock.monotonic() - started)

    def _apply(
        self, run: ImportRun, page: ImportPage, items: list[TalentItem]
    ) -> tuple[BatchOutcome, StageCounters]:
        now = self._clock.now()
        # The page's replica writes and events: the events carry this span's traceparent.
        with (
            traced(_tracer, "talent-import.write", {"items": len(items)}),
            self._store.page_transaction(page, now, self._lease.until(now)) as tx,
        ):
            items = in_scope(tx, run, page.stage, items)
            memory = tx.dry_run_memory(run.run_id) if run.dry_run else None
            options = ApplyOptions(run_id=run.run_id, dry_run=run.dry_run, memory=memory)
            ctx = Context(correlation_id=run.correlation_id, now=now, traceparent=current_traceparent())
            batch = apply_snapshots(tx.replica, [SourceItem(item) for item in items], ctx, options)
            counters = batch.counters(planned=len(items))
            tx.complete_page(page, counters, count_planned=run.mode is ImportMode.TOPIC_REPLAY)
            tx.commit()
        return batch, counters

    def _release(self, run: ImportRun, page: ImportPage, exc: Exception) -> None:
        """Back to Pending after a back-off, or Failed once its attempts are spent."""
        now, error = self._clock.now(), describe_error(exc)
        release = self._lease.release(now, page.attempt, count_attempt=True, error=error)
        status = self._store.release(page, now, release, self._lease.max_attempts)
        self._observer.page_released(run, page, status, self._lease.backoff.delay(page.attempt), error)


def in_scope(
    tx: ImportPageTransaction, run: ImportRun, stage: ImportStage, items: list[TalentItem]
) -> list[TalentItem]:
    """A filtered run applies one company and its users; a deleted user (a tombstone names no tenant) belongs
    to the scope when the replica has it under that company."""
    tenant = run.tenant_filter
    if tenant is None:
        return items
    if stage is ImportStage.TENANTS:
        return [item for item in items if item.tenant_id == tenant]
    ours = _deleted_users_of(tx, tenant, items)
    return [item for item in items if item.tenant_id == tenant or (item.tombstone and item.talent_id in ours)]


def _deleted_users_of(tx: ImportPageTransaction, tenant: UUID, items: list[TalentItem]) -> set[UUID]:
    """The users among the items' tombstones that the replica has under `tenant`."""
    tombstoned = [item.talent_id for item in items if item.tombstone and item.talent_id is not None]
    return tx.talent_users_of_tenant(tenant, tombstoned) if tombstoned else set()

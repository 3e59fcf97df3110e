"""What every applied Talent item leaves behind: metrics and, when quarantined, a log line without PII."""

from __future__ import annotations

from uuid import UUID

from prometheus_client import Counter

from pin_identity.domain.talent import ImportStage, ItemResult, SyncErrorCode
from pin_identity.observability import metrics
from pin_identity.observability.logging import get_logger
from pin_identity.operations.talent_replica import ItemOutcome

log = get_logger("talent-replica")

_AGGREGATE = {ImportStage.TENANTS: "company", ImportStage.USERS: "user"}


def record_outcome(
    outcome: ItemOutcome,
    *,
    metric: Counter,
    correlation_id: UUID | None,
    run_id: UUID | None = None,
    page_no: int | None = None,
) -> None:
    """Metrics and the quarantine log line of one applied item (shared with the initial import): the line
    names the run and its page, or for the consumer the batch, by its events' correlation id."""
    aggregate = _AGGREGATE[outcome.stage]
    metric.labels(aggregate=aggregate, result=outcome.result.value).inc()
    if outcome.stale:
        metrics.talent_sync_stale_events_total.labels(aggregate=aggregate).inc()
    if outcome.error is SyncErrorCode.PHONE_CONFLICT:
        metrics.talent_sync_conflicts_total.inc()
    if outcome.result is ItemResult.FAILED:
        event = "item-deferred" if outcome.retry_at is not None else "item-quarantined"
        log.warning(
            event,
            run_id=str(run_id) if run_id else None,
            page_no=page_no,
            correlation_id=str(correlation_id) if correlation_id else None,
            stage=outcome.stage.value,
            external_id=str(outcome.external_id) if outcome.external_id else None,
            error_code=outcome.error.value if outcome.error else None,
            reason=outcome.reason,
            retry_at=outcome.retry_at.isoformat() if outcome.retry_at else None,
        )

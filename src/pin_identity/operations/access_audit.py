"""`access audit`: the access topic's last event per user against the database's current truth."""

from __future__ import annotations

from pin_identity.domain.access_verdicts import AuditReport, compare
from pin_identity.operations.ports.access_reads import AccessLog, AccessTruth, Progress


def audit_access(log: AccessLog, truth: AccessTruth, progress: Progress) -> AuditReport:
    # The topic first, then the database: a change committed meanwhile is still in the outbox (pending)
    # unless its event was published in the moment between the two, which shows as drift that a second
    # audit no longer finds. On a quiet system (the outbox drained) the answer is exact.
    with truth.session() as session:
        read = log.read(session.keep, progress)
        with session.snapshot() as snapshot:
            report = compare(snapshot.last_events(), snapshot.truths(), snapshot.pending())
    return report.model_copy(update={"incomplete_partitions": list(read.incomplete)})

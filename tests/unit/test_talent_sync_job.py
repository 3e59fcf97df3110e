"""The continuous consumer's decisions over an in-memory stream and replica: offsets only after the database
commit, a rolled-back batch read again, deferred users retried with back-off, `once` ending when caught up."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY

from pin_identity.config import TalentSyncSettings
from pin_identity.domain.talent import SyncErrorCode
from pin_identity.jobs.talent_sync import TalentSyncJob
from pin_identity.jobs.talent_sync_observer import TalentSyncObserver
from pin_identity.operations.ports.talent_sources import TalentRecord
from pin_identity.operations.talent_replica import BatchOutcome
from tests.support.clocks import ManualClock
from tests.support.memory_talent import MemoryReplica, MemoryStream, tenant_item, user_item

START = datetime(2026, 12, 1, tzinfo=UTC)


def _job(
    stream: MemoryStream, replica: MemoryReplica, clock: ManualClock, **settings: float
) -> TalentSyncJob:
    return TalentSyncJob(stream, replica, TalentSyncSettings(batch_size=10, **settings), clock=clock)


def test_a_batch_commits_its_offsets_after_its_transaction_its_tenants_first() -> None:
    stream, replica, tenant = MemoryStream(), MemoryReplica(), uuid.uuid4()
    stream.publish(user_item(tenant), tenant_item(tenant))

    assert _job(stream, replica, ManualClock(START)).step() is True

    assert stream.committed == [0, 1]
    assert len(replica.state.users) == 1 and replica.state.quarantine == {}  # the user found its tenant


def test_a_batch_that_rolled_back_is_read_again_and_its_offsets_stay() -> None:
    stream, replica = MemoryStream(), MemoryReplica()
    stream.publish(tenant_item(), tenant_item())
    replica.fail_commits = 1
    job = _job(stream, replica, ManualClock(START))

    failed = job.step()
    retried = job.step()

    assert (failed, stream.rewound) == (False, 1)
    assert (retried, stream.committed, len(replica.state.companies)) == (True, [0, 1], 2)


def test_an_offset_commit_that_fails_after_the_database_commit_is_not_fatal() -> None:
    class _Refusing(MemoryStream):
        def commit(self, records: Sequence[TalentRecord]) -> None:
            raise RuntimeError("the group rebalanced")

    stream, replica = _Refusing(), MemoryReplica()
    stream.publish(tenant_item())

    assert _job(stream, replica, ManualClock(START)).step() is True
    assert len(replica.state.companies) == 1 and stream.rewound == 0


def test_a_user_before_its_tenant_is_retried_when_due_and_at_once_when_its_tenant_applies() -> None:
    stream, replica, clock, tenant = MemoryStream(), MemoryReplica(), ManualClock(START), uuid.uuid4()
    job = _job(stream, replica, clock, retry_base_s=1.0)
    stream.publish(user_item(tenant))
    job.step()
    [deferred] = replica.state.quarantine.values()
    clock.advance(0.5)
    job.step()  # not due yet
    early = replica.state.quarantine[deferred.entry_id].attempt_count
    clock.advance(0.5)
    job.step()  # due: tried again, the tenant still missing
    [again] = replica.state.quarantine.values()
    stream.publish(tenant_item(tenant))

    job.step()  # the tenant applies, and the user with it: its next try (2 s away) is not waited for

    assert (deferred.error_code, deferred.next_attempt_at) == (
        SyncErrorCode.COMPANY_NOT_FOUND.value,
        datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC),
    )
    assert (early, again.attempt_count, again.next_attempt_at) == (
        1,
        2,
        datetime(2026, 12, 1, 0, 0, 3, tzinfo=UTC),
    )
    assert (len(replica.state.users), replica.state.quarantine) == (1, {})


def test_a_user_deferred_too_often_stays_in_the_quarantine_for_the_operator() -> None:
    stream, replica, clock = MemoryStream(), MemoryReplica(), ManualClock(START)
    job = _job(stream, replica, clock, max_deferrals=1)
    stream.publish(user_item(uuid.uuid4()))
    job.step()
    clock.advance(3600)

    job.step()

    [entry] = replica.state.quarantine.values()
    assert (entry.attempt_count, entry.next_attempt_at) == (2, None)


def test_once_ends_when_caught_up_and_closes_the_stream() -> None:
    stream, replica = MemoryStream(), MemoryReplica()
    stream.publish(*[tenant_item() for _ in range(25)])

    _job(stream, replica, ManualClock(START), poll_timeout_s=0.001).run(threading.Event(), once=True)

    assert (stream.committed, stream.closed) == (list(range(25)), True)
    assert len(replica.state.companies) == 25


class RecordingObserver(TalentSyncObserver):
    """The hooks the job called, in order: what operators see, and what tests can wait on."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def started(self, batch_size: int) -> None:
        self.calls.append("started")

    def stopped(self) -> None:
        self.calls.append("stopped")

    def lag_measured(self, lag: Mapping[tuple[str, int], int]) -> None:
        self.calls.append(f"lag {sum(lag.values())}")

    def batch_applied(self, records: int, batch: BatchOutcome) -> None:
        self.calls.append(f"applied {batch.applied} of {records}")

    def offset_commit_failed(self, exc: Exception) -> None:
        self.calls.append(f"offsets not committed: {exc}")

    def batch_failed(self, exc: Exception, failures: int) -> None:
        self.calls.append(f"batch failed {failures}: {exc}")

    def deferred_retried(self, items: int, batch: BatchOutcome) -> None:
        self.calls.append(f"retried {batch.applied} of {items}")

    def retry_failed(self, exc: Exception) -> None:
        self.calls.append(f"retry failed: {exc}")

    def offsets_recommitted(self, partitions: int) -> None:
        self.calls.append(f"offsets recommitted: {partitions}")


def _observed(
    stream: MemoryStream, replica: MemoryReplica, clock: ManualClock
) -> tuple[TalentSyncJob, RecordingObserver]:
    observer = RecordingObserver()
    settings = TalentSyncSettings(batch_size=10, poll_timeout_s=0.001, retry_base_s=1.0)
    return TalentSyncJob(stream, replica, settings, clock=clock, observer=observer), observer


def test_the_observer_hears_the_batches_the_lag_and_the_end() -> None:
    stream, replica = MemoryStream(), MemoryReplica()
    stream.publish(*[tenant_item() for _ in range(12)])
    job, observer = _observed(stream, replica, ManualClock(START))

    job.run(threading.Event(), once=True)

    assert observer.calls == ["started", "applied 10 of 10", "lag 2", "applied 2 of 2", "lag 0", "stopped"]


def test_the_observer_hears_a_rolled_back_batch_then_its_replay() -> None:
    stream, replica = MemoryStream(), MemoryReplica()
    stream.publish(tenant_item())
    replica.fail_commits = 2
    job, observer = _observed(stream, replica, ManualClock(START))

    for _ in range(3):
        job.step()

    failed = "batch failed {}: the database went away"
    assert observer.calls == [failed.format(1), failed.format(2), "applied 1 of 1"]


def test_the_observer_hears_a_deferred_user_retried_and_a_retry_that_rolled_back() -> None:
    stream, replica, clock, tenant = MemoryStream(), MemoryReplica(), ManualClock(START), uuid.uuid4()
    job, observer = _observed(stream, replica, clock)
    stream.publish(user_item(tenant))
    job.step()
    clock.advance(1)
    replica.fail_commits = 1

    job.step()
    job.step()

    assert observer.calls == [
        "applied 0 of 1",
        "retry failed: the database went away",
        "retried 0 of 1",
    ]


def test_the_observer_hears_an_offset_commit_that_failed_after_the_batch_applied() -> None:
    class _Refusing(MemoryStream):
        def commit(self, records: Sequence[TalentRecord]) -> None:
            raise RuntimeError("the group rebalanced")

    stream, replica = _Refusing(), MemoryReplica()
    stream.publish(tenant_item())
    job, observer = _observed(stream, replica, ManualClock(START))

    job.step()

    assert observer.calls == ["offsets not committed: the group rebalanced", "applied 1 of 1"]


def test_readiness_warns_of_offsets_the_coordinator_did_not_take_until_a_commit_succeeds() -> None:
    class _CoordinatorAway(MemoryStream):
        away = True

        def commit(self, records: Sequence[TalentRecord]) -> None:
            if self.away:
                raise RuntimeError("KafkaError{code=COORDINATOR_NOT_AVAILABLE}")
            super().commit(records)

    stream, replica, observer = _CoordinatorAway(), MemoryReplica(), TalentSyncObserver()
    job = TalentSyncJob(
        stream, replica, TalentSyncSettings(batch_size=10), clock=ManualClock(START), observer=observer
    )
    failures = REGISTRY.get_sample_value("talent_sync_offset_commit_failures_total") or 0.0
    assert observer.readiness_warning() is None

    stream.publish(tenant_item())
    job.step()
    warned = observer.readiness_warning()
    stream.away = False
    stream.publish(tenant_item())
    job.step()

    assert (
        warned
        == "talent-sync cannot commit its offsets: RuntimeError: KafkaError{code=COORDINATOR_NOT_AVAILABLE}"
    )
    assert observer.readiness_warning() is None and stream.committed  # the second batch's offsets went
    assert REGISTRY.get_sample_value("talent_sync_offset_commit_failures_total") == failures + 1


def test_offsets_whose_commit_was_lost_are_committed_again_though_no_newer_record_comes() -> None:
    @dataclass
    class _LosesTheFirstCommit(MemoryStream):
        """Its first commit answers but is lost (the coordinator moved meanwhile)."""

        applied: list[int] = field(default_factory=list)

        def commit(self, records: Sequence[TalentRecord]) -> None:
            if self.applied:
                super().commit(records)
            self.applied = [record.offset for record in records]

        def recommit(self) -> int | None:
            behind = [offset for offset in self.applied if offset not in self.committed]
            self.committed.extend(behind)
            return 1 if behind else 0  # partitions: all of it is partition 0

    stream, replica = _LosesTheFirstCommit(), MemoryReplica()
    stream.publish(tenant_item(), tenant_item())
    job, observer = _observed(stream, replica, ManualClock(START))

    job.run(threading.Event(), once=True)

    assert stream.committed == [0, 1]
    assert "offsets recommitted: 1" in observer.calls


def test_an_idle_stream_stops_warning_once_the_committed_offsets_are_read_again() -> None:
    observer = TalentSyncObserver()
    observer.offset_commit_failed(RuntimeError("KafkaError{code=NOT_COORDINATOR}"))
    assert observer.readiness_warning() is not None

    observer.lag_measured({("talent.users", 0): 3})

    assert observer.readiness_warning() is None


def test_a_partition_that_reads_nothing_while_records_wait_is_said_to_stall_until_it_moves() -> None:
    @dataclass
    class _LeaderLost(MemoryStream):
        """Its partition's leader is lost: its records are known to be there, none can be read."""

        lost: bool = True

        def poll(self, max_records: int, timeout_s: float) -> list[TalentRecord]:
            return [] if self.lost else super().poll(max_records, timeout_s)

    stream, clock = _LeaderLost(), ManualClock(START)
    stream.publish(tenant_item(), tenant_item())
    job, observer = _observed(stream, MemoryReplica(), clock)

    job.step()
    clock.advance(4)
    job.step()
    early = (observer.readiness_warning(), REGISTRY.get_sample_value("talent_sync_stalled_seconds"))
    clock.advance(2)
    job.step()
    stalled = (observer.readiness_warning(), REGISTRY.get_sample_value("talent_sync_stalled_seconds"))
    stream.lost = False
    job.step()

    assert early == (None, 4.0)
    assert stalled == ("talent-sync has read nothing for 6 s of a partition with records left", 6.0)
    assert (observer.readiness_warning(), REGISTRY.get_sample_value("talent_sync_stalled_seconds")) == (
        None,
        0.0,
    )


def test_a_partition_read_to_its_end_never_stalls_however_long_it_waits() -> None:
    stream, clock = MemoryStream(), ManualClock(START)
    stream.publish(tenant_item())
    job = _job(stream, MemoryReplica(), clock)

    job.step()
    clock.advance(3600)
    job.step()

    assert REGISTRY.get_sample_value("talent_sync_stalled_seconds") == 0.0


def test_a_batch_is_applied_in_a_span_whose_traceparent_its_events_carry() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pin_identity.jobs import talent_sync
    from pin_identity.observability.tracing import new_provider

    exporter = InMemorySpanExporter()
    provider = new_provider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    stream, replica, tenant = MemoryStream(), MemoryReplica(), uuid.uuid4()
    stream.publish(tenant_item(tenant), user_item(tenant))
    original = talent_sync._tracer
    talent_sync._tracer = provider.get_tracer("test")
    try:
        _job(stream, replica, ManualClock(START)).step()
    finally:
        talent_sync._tracer = original

    [span] = exporter.get_finished_spans()
    assert span.name == "talent-sync.apply"
    assert span.attributes is not None
    assert (span.attributes["records"], span.attributes["itemsApplied"]) == (2, 2)
    names_the_span = f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-"
    # CompanyUpserted, UserUpserted and the manager's UserAccessChanged of the batch: all name the span (the
    # flags after it say sampled, and the SDK's random trace id).
    assert len(replica.state.events) == 3
    assert {(event.traceparent or "")[:-2] for event in replica.state.events} == {names_the_span}
    assert {str(event.correlation_id) for event in replica.state.events} == {span.attributes["correlationId"]}


def test_the_lag_in_time_is_the_age_of_the_oldest_unapplied_record_and_0_once_caught_up() -> None:
    clock = ManualClock(START)
    stream, replica = MemoryStream(), MemoryReplica()
    stream.publish(tenant_item(), tenant_item(), at=START - timedelta(minutes=7))
    stream.publish(tenant_item(), at=START - timedelta(minutes=1))
    job = TalentSyncJob(stream, replica, TalentSyncSettings(batch_size=1), clock=clock)
    age = lambda: REGISTRY.get_sample_value(  # noqa: E731
        "talent_sync_consumer_lag_seconds", {"topic": "talent", "partition": "0"}
    )

    job.report_lag()
    assert age() == 7 * 60  # nothing applied: the first record's timestamp
    job.step()
    job.step()
    job.report_lag()
    assert age() == 60  # the third is the oldest left
    job.step()
    job.report_lag()
    assert age() == 0

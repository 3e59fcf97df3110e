"""What the jobs need from the outside world; adapters implement these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple, Protocol
from uuid import UUID

from pin_identity.domain.events import AccessChangeTemplate
from pin_identity.domain.talent import ImportStage, TalentItem
from pin_identity.domain.talent_import import (
    ImportPage,
    ImportRequest,
    ImportRun,
    PageProgress,
    PageStatus,
    PlanStep,
    RunStatus,
    StageCounters,
)
from pin_identity.operations.ports import DryRunMemory, ReplicaTransaction

# Re-exported: the source's failures and the run lock are the operator's as much as the job's.
from pin_identity.operations.ports import RunLock as RunLock  # noqa: PLC0414


class PendingEvent(NamedTuple):
    """An outbox row as the relay sends it: ids as text, the value as UTF-8 bytes, ready for the wire."""

    outbox_id: int
    topic: str
    key: str
    value: bytes
    event_type: str
    correlation_id: str
    traceparent: str | None


@dataclass
class PublishReport:
    """What the broker said about a batch: acknowledged, rejected for good, or to be tried again."""

    delivered: list[int] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)
    retry: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OutboxWriter:
    """A session whose transaction took an outbox id and has not ended: the relay publishes nothing after
    that id until it does. Its figures are None where the relay's role may not see other roles' sessions."""

    pid: int | None
    application_name: str | None
    transaction_s: float | None


@dataclass(frozen=True)
class OutboxBacklog:
    waiting: int  # rows not yet acknowledged
    oldest_age_s: float  # the age of the oldest of them
    held_s: float = 0.0  # how long the oldest running writer's transaction has run: publishing waits on it
    held_by: OutboxWriter | None = None


class RelayRole(StrEnum):
    STANDBY = "standby"  # another relay holds the lock
    ACTIVE = "active"  # this relay holds the lock, and the one before it stood down cleanly
    TAKEN_OVER = "taken_over"  # just took the lock from a relay that did not say its producer was empty


class OutboxQueue(Protocol):
    def try_become_active(self) -> RelayRole:
        """Whether this process is the one active relay (others stand by), and how it became so."""
        ...

    def fetch_ready(self, limit: int, after: int) -> list[PendingEvent]:
        """Committed rows with ids above `after`, in outbox order, never past a row that may still commit.
        OutboxIdsWentBackError when the id sequence restarted below what this session read."""
        ...

    def settle(self, delivered: Sequence[int], rejected: Mapping[int, str]) -> None: ...
    def backlog(self) -> OutboxBacklog:
        """Rows waiting, the age of the oldest, and the oldest running writer publishing waits on."""
        ...

    def is_drained(self) -> bool:
        """No committed row is left in the outbox."""
        ...

    def heartbeat(self) -> None:
        """Raises when the session (and with it the relay lock) is gone."""
        ...

    def stand_down(self) -> None:
        """Say that nothing this relay handed out can still reach the broker, then drop the session (and
        the lock). Best effort: a session that is already gone cannot say it, and the next relay waits."""
        ...


class EventPublisher(Protocol):
    def start(self) -> None:
        """Start the broker client unless it runs: its handshake then overlaps the caller's first reads."""
        ...

    def send(self, events: Sequence[PendingEvent]) -> PublishReport:
        """Hand events to the broker client; the report holds only what failed at once."""
        ...

    def collect(self, timeout_s: float) -> PublishReport:
        """What the broker answered since the last call, waiting up to timeout_s for a first answer. A wait
        says the relay has nothing more to hand over for now: a publisher that batches (a transaction) sends
        what it holds at once."""
        ...

    def discard(self) -> None:
        """Drop everything the client still holds and the client itself (its connections close), so that
        nothing handed to it before can reach the broker later."""
        ...


class StopSignal(Protocol):
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


# ---------------------------------------------------------------- access fan-out


@dataclass(frozen=True)
class FanOutTask:
    """A claimed AccessFanOutTask; claim_id fences every write of this lease (the jobRunId of the claim)."""

    task_id: UUID
    role_id: UUID
    company_id: UUID | None
    role_version: int
    cursor: UUID | None
    processed_count: int
    attempt: int
    created_at: datetime
    claim_id: UUID


@dataclass(frozen=True)
class PoisonedTask:
    task_id: UUID
    role_id: UUID
    attempts: int
    last_error: str | None


@dataclass(frozen=True)
class QueueStats:
    backlog: int
    failed: int


class PageWritten(NamedTuple):
    """A fan-out page as written: how many users it held, and the last one (the next cursor)."""

    size: int
    last_user_id: UUID | None


class FanOutBatch(Protocol):
    """One batch's transaction; the lease was checked (and renewed) when it opened."""

    def write_page(
        self, role_id: UUID, after: UUID | None, size: int, template: AccessChangeTemplate
    ) -> PageWritten:
        """Locks the next page of the role's users (by id, after `after`, at most `size`) and writes each
        one's UserAccessChanged with their full snapshot from `template`."""
        ...

    def advance(self, *, cursor: UUID | None, processed: int, completed: bool) -> None: ...
    def commit(self) -> None: ...


class FanOutQueue(Protocol):
    def fail_exhausted(self, now: datetime, max_attempts: int) -> list[PoisonedTask]: ...
    def claim(self, claim_id: UUID, now: datetime, lease_until: datetime) -> FanOutTask | None: ...
    def batch(
        self, task: FanOutTask, now: datetime, lease_until: datetime
    ) -> AbstractContextManager[FanOutBatch]:
        """Opens the batch transaction; its first statement raises LeaseLostError when the lease is no longer
        this claim's."""
        ...

    def release(
        self,
        task: FanOutTask,
        now: datetime,
        *,
        available_at: datetime,
        count_attempt: bool,
        error: str | None,
    ) -> None: ...
    def stats(self, now: datetime) -> QueueStats: ...


class TaskWakeups(Protocol):
    def wait(self, timeout_s: float) -> bool:
        """Block until a new task is announced (True) or the timeout passes (False)."""
        ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- Talent consumer


@dataclass(frozen=True)
class TalentRecord:
    """One record of a Talent topic: where it sits (to commit past it), and what it holds, read once."""

    topic: str
    partition: int
    offset: int
    item: TalentItem  # its stage says which of the two topics it came from


class TalentStream(Protocol):
    """The continuous consumer's view of the Talent topics (a consumer group, offsets committed by hand)."""

    def poll(self, max_records: int, timeout_s: float) -> list[TalentRecord]: ...
    def commit(self, records: Sequence[TalentRecord]) -> None:
        """Mark every record up to the last of each partition as consumed (after the database commit)."""
        ...

    def rewind(self, records: Sequence[TalentRecord]) -> None:
        """Read these records again: their transaction rolled back."""
        ...

    def lag(self) -> dict[tuple[str, int], int] | None:
        """Records behind the end per assigned partition; None until the group assigned partitions."""
        ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- Talent initial import


class TalentSource(Protocol):
    """Where an import reads Talent's snapshots: the HTTP API (ApiPull) or the compacted topics (TopicReplay).
    Cursors are the source's own: the job stores and hands them back without reading them."""

    def check(self) -> None:
        """Raise SourceUnavailableError unless the source can be used (checked before anything is written)."""
        ...

    def count_companies(self, tenant_filter: UUID | None) -> int | None:
        """How many companies the source lists within the scope, None if it cannot tell cheaply."""
        ...

    def plan(
        self, stage: ImportStage, cursor: str | None, page_no: int, page_size: int, tenant_filter: UUID | None
    ) -> PlanStep: ...
    def read(
        self, stage: ImportStage, cursor: str | None, page_size: int, tenant_filter: UUID | None
    ) -> list[TalentItem]: ...
    def handover(self, cursors: Sequence[str | None]) -> None:
        """After a complete replay: let the continuous consumer resume where the replay ended."""
        ...

    def close(self) -> None: ...


class ImportPageTransaction(ReplicaTransaction, Protocol):
    """The replica transaction of one page, already fenced: the page is still this claim's."""

    def complete_page(self, page: ImportPage, counters: StageCounters, *, count_planned: bool) -> None: ...
    def dry_run_memory(self, run_id: UUID) -> DryRunMemory: ...
    def talent_users_of_tenant(self, tenant_id: UUID, user_ids: Sequence[UUID]) -> set[UUID]: ...


class ImportStore(Protocol):
    def running_run(self) -> ImportRun | None: ...
    def load_run(self, run_id: UUID) -> ImportRun | None: ...
    def latest_run(self) -> ImportRun | None: ...
    def create_run(self, request: ImportRequest, correlation_id: UUID, now: datetime) -> ImportRun: ...
    def replica_company_count(self, tenant_filter: UUID | None) -> int: ...
    def add_planned_pages(self, run: ImportRun, stage: ImportStage, step: PlanStep) -> bool:
        """False (nothing written) when the run's listing is no longer where `run` says it is."""
        ...

    def progress(self, run_id: UUID) -> PageProgress: ...
    def page_cursors(self, run_id: UUID, stage: ImportStage) -> list[str | None]: ...
    def finish_run(
        self,
        run_id: UUID,
        status: RunStatus,
        now: datetime,
        *,
        error_code: str | None = None,
        error: str | None = None,
    ) -> bool: ...

    def claim_page(
        self, claim_id: UUID, now: datetime, lease_until: datetime, max_attempts: int, run_id: UUID | None
    ) -> ImportPage | None: ...
    def page_transaction(
        self, page: ImportPage, now: datetime, lease_until: datetime
    ) -> AbstractContextManager[ImportPageTransaction]:
        """Opens the page's transaction; raises LeaseLostError when the page is no longer this claim's."""
        ...

    def release_page(
        self, page: ImportPage, now: datetime, *, available_at: datetime, max_attempts: int, error: str
    ) -> PageStatus | None: ...

"""In-memory fakes of the Talent ports: the replica (ReplicaTransaction, and the import's page transaction),
the import store, the run lock, a source and a stream. They keep what the jobs' and the use case's decisions
depend on; the SQL behind the real ones is tested on PostgreSQL (tests/integration)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pin_identity.adapters.talent_wire import read_item
from pin_identity.domain.errors import (
    LeaseLostError,
    SourceRejectedError,
    SourceUnavailableError,
    StoreConflictError,
)
from pin_identity.domain.events import CompanyState, OutboxMessage, UserState
from pin_identity.domain.import_run import (
    ImportMode,
    ImportPage,
    ImportRequest,
    ImportRun,
    PageProgress,
    PageStatus,
    PlannedPage,
    PlanStep,
    RunEnding,
    RunStatus,
    StageCounters,
)
from pin_identity.domain.lease import Release
from pin_identity.domain.model import RenderedAccessSnapshot, RoleStatus, UserAccessSnapshot
from pin_identity.domain.talent import ImportStage, TalentItem
from pin_identity.operations.ports.identity_records import RoleRecord
from pin_identity.operations.ports.replica import DefaultGrant, Quarantined, QuarantineEntry, SourceItem
from pin_identity.operations.ports.talent_sources import TalentRecord

DEFAULT_ROLE = RoleRecord(uuid.uuid4(), "developer-manager", None, RoleStatus.ACTIVE, 1)


def tenant_item(tenant_id: UUID | None = None, *, version: int = 1, **fields: Any) -> TalentItem:
    tenant = str(tenant_id or uuid.uuid4())
    value = {"tenantId": tenant, "version": version, "name": "Stroy", "companyType": "Developer", **fields}
    return read_item(ImportStage.TENANTS, tenant, value)


def user_item(tenant_id: UUID, user_id: UUID | None = None, *, version: int = 1, **fields: Any) -> TalentItem:
    user = str(user_id or uuid.uuid4())
    value = {
        "userId": user,
        "tenantId": str(tenant_id),
        "version": version,
        "phone": f"+7912{uuid.UUID(user).int % 10**7:07d}",
        "firstName": "Ivan",
        "lastName": "Petrov",
        **fields,
    }
    return read_item(ImportStage.USERS, user, value)


# ---------------------------------------------------------------- the replica


@dataclass
class ReplicaState:
    companies: dict[UUID, CompanyState] = field(default_factory=dict)  # by Talent tenant id
    users: dict[UUID, UserState] = field(default_factory=dict)  # by Talent user id
    deleted: dict[tuple[str, UUID], int] = field(default_factory=dict)
    quarantine: dict[UUID, QuarantineEntry] = field(default_factory=dict)
    roles: dict[UUID, set[UUID]] = field(default_factory=dict)  # user id -> Active role ids
    events: list[OutboxMessage] = field(default_factory=list)

    def event_types(self) -> list[str]:
        return [m.event_type for m in self.events]


@dataclass
class MemoryReplica:
    """The committed state; each transaction works on a copy and replaces it on commit."""

    state: ReplicaState = field(default_factory=ReplicaState)
    locks: list[tuple[str, list[UUID]]] = field(default_factory=list)
    fail_commits: int = 0  # how many commits still fail (the database is away)
    concurrent_phones: set[str] = field(default_factory=set)  # taken by another writer after our reads

    @contextmanager
    def __call__(self) -> Iterator[MemoryReplicaTransaction]:
        yield MemoryReplicaTransaction(self)


class MemoryReplicaTransaction:
    def __init__(self, replica: MemoryReplica):
        self._replica = replica
        self.state = copy.deepcopy(replica.state)

    def commit(self) -> None:
        if self._replica.fail_commits:
            self._replica.fail_commits -= 1
            raise RuntimeError("the database went away")
        self._replica.state = self.state

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        saved = copy.deepcopy(self.state)
        try:
            yield
        except StoreConflictError:
            self.state = saved
            raise

    @contextmanager
    def pipelined(self) -> Iterator[None]:
        yield

    def lock_talent_ids(self, stage: str, talent_ids: Sequence[UUID]) -> None:
        self._replica.locks.append((stage, list(talent_ids)))

    def companies_by_tenant(
        self, tenant_ids: Sequence[UUID], *, shared: bool = False
    ) -> dict[UUID, CompanyState]:
        return {t: self.state.companies[t] for t in tenant_ids if t in self.state.companies}

    def lock_managers(self, company_ids: Sequence[UUID]) -> dict[UUID, UUID]:
        return {
            u.user_id: u.company_id
            for u in self.state.users.values()
            if u.company_id in company_ids and u.status != "Blocked"
        }

    def managers_without_default_role(
        self, user_ids: Sequence[UUID], role_id: UUID
    ) -> list[tuple[UUID, UUID]]:
        return [
            (u.user_id, u.company_id)
            for u in self.state.users.values()
            if u.user_id in user_ids
            and u.company_id
            and role_id not in self.state.roles.get(u.user_id, set())
        ]

    def users_by_talent_id(self, talent_ids: Sequence[UUID], *, lock: bool) -> dict[UUID, UserState]:
        return {t: self.state.users[t] for t in talent_ids if t in self.state.users}

    def phone_owners(self, phones: Sequence[str]) -> dict[str, UUID]:
        return {u.phone: u.user_id for u in self.state.users.values() if u.phone in phones}

    def default_role(self) -> RoleRecord:
        return DEFAULT_ROLE

    def deleted_versions(self, stage: str, talent_ids: Sequence[UUID]) -> dict[UUID, int]:
        return {t: self.state.deleted[(stage, t)] for t in talent_ids if (stage, t) in self.state.deleted}

    def waiting_versions(self, stage: str, talent_ids: Sequence[UUID]) -> dict[UUID, int]:
        waiting: dict[UUID, int] = {}
        for entry in self.state.quarantine.values():
            version = entry.payload.get("version") if isinstance(entry.payload, dict) else None
            deferred = entry.run_id is None and entry.next_attempt_at is not None and entry.stage == stage
            if deferred and entry.external_id in talent_ids and isinstance(version, int):
                waiting[entry.external_id] = min(version, waiting.get(entry.external_id, version))
        return waiting

    def remember_deletions(self, stage: str, versions: Mapping[UUID, int]) -> None:
        self.state.deleted.update({(stage, t): v for t, v in versions.items()})

    def save_companies(
        self, created: Sequence[CompanyState], updated: Sequence[CompanyState], synced_at: datetime
    ) -> None:
        by_id = {c.company_id: t for t, c in self.state.companies.items()}
        for company in created:
            assert company.external_talent_tenant_id is not None
            self.state.companies[company.external_talent_tenant_id] = company
        for company in updated:
            self.state.companies[by_id[company.company_id]] = company

    def save_users(
        self, created: Sequence[UserState], updated: Sequence[UserState], synced_at: datetime
    ) -> None:
        for user in [*created, *updated]:
            if user.phone in self._replica.concurrent_phones:
                raise StoreConflictError("phone")
            if any(u.phone == user.phone and u.user_id != user.user_id for u in self.state.users.values()):
                raise StoreConflictError("phone")  # the unique constraint on users.phone
            assert user.external_talent_user_id is not None
            self.state.users[user.external_talent_user_id] = user

    def revoke_user_assignments(
        self, user_ids: Sequence[UUID], role_id: UUID | None
    ) -> list[tuple[UUID, UUID]]:
        revoked = []
        for user in user_ids:
            held = self.state.roles.get(user, set())
            gone = {r for r in held if role_id is None or r == role_id}
            held -= gone
            revoked += [(user, r) for r in sorted(gone)]
        return revoked

    def grant_default_role(self, role: RoleRecord, grants: Sequence[DefaultGrant]) -> None:
        for grant in grants:
            self.state.roles.setdefault(grant.user_id, set()).add(role.role_id)

    def access_versions(self, user_ids: Sequence[UUID]) -> dict[UUID, int]:
        return dict.fromkeys(user_ids, 1)

    def access_snapshots(self, user_ids: Sequence[UUID]) -> list[UserAccessSnapshot]:
        companies = {u.user_id: u.company_id for u in self.state.users.values()}
        return [UserAccessSnapshot(user, companies.get(user), ()) for user in user_ids]

    def access_changes(self, user_ids: Sequence[UUID]) -> dict[UUID, tuple[RenderedAccessSnapshot, int]]:
        companies = {u.user_id: u.company_id for u in self.state.users.values()}
        return {user: (RenderedAccessSnapshot(user, companies.get(user), "[]"), 1) for user in user_ids}

    def quarantine(self, entries: Sequence[QuarantineEntry]) -> None:
        for entry in entries:
            seen = [
                e
                for e in self.state.quarantine.values()
                if e.run_id is None
                and entry.run_id is None
                and (e.stage, e.external_id, e.error_code, e.payload)
                == (entry.stage, entry.external_id, entry.error_code, entry.payload)
            ]
            if entry.entry_id in self.state.quarantine or not seen:
                self.state.quarantine[entry.entry_id] = entry

    def due_quarantined(self, now: datetime, limit: int) -> list[SourceItem]:
        deferred = [
            e
            for e in self.state.quarantine.values()
            if e.run_id is None and e.next_attempt_at is not None and e.payload is not None
        ]
        due = sorted(
            (e for e in deferred if e.next_attempt_at <= now), key=lambda e: e.next_attempt_at or now
        )
        entities = list(dict.fromkeys((e.stage, e.external_id) for e in due))[:limit]
        chosen = [e for e in deferred if (e.stage, e.external_id) in entities]
        chosen.sort(key=lambda e: (entities.index((e.stage, e.external_id)), e.payload.get("version", 0)))
        return [_again(e) for e in chosen]

    def quarantined_for_replay(self, run_id: UUID | None, entry_ids: Sequence[UUID] | None) -> Quarantined:
        chosen = [
            e
            for e in self.state.quarantine.values()
            if e.run_id == run_id and (entry_ids is None or e.entry_id in entry_ids)
        ]
        return Quarantined(
            [_again(e) for e in chosen if e.payload is not None],
            [e.entry_id for e in chosen if e.payload is None],
        )

    def release_quarantined(self, entry_ids: Sequence[UUID]) -> None:
        for entry_id in entry_ids:
            self.state.quarantine.pop(entry_id, None)

    def wake_deferred(self, tenant_ids: Sequence[UUID], now: datetime) -> None:
        waiting = {str(t) for t in tenant_ids}
        for entry in list(self.state.quarantine.values()):
            deferred = (
                entry.run_id is None and entry.next_attempt_at is not None and entry.next_attempt_at > now
            )
            if deferred and entry.stage == "Users" and str(entry.payload.get("tenantId")).lower() in waiting:
                self.state.quarantine[entry.entry_id] = replace(entry, next_attempt_at=now)

    def discard_quarantined(self, stage: str, talent_ids: Sequence[UUID]) -> None:
        for entry in list(self.state.quarantine.values()):
            if entry.stage == stage and entry.external_id in talent_ids:
                del self.state.quarantine[entry.entry_id]

    def add_events(self, messages: Sequence[OutboxMessage]) -> None:
        self.state.events.extend(messages)


def _again(entry: QuarantineEntry) -> SourceItem:
    key = str(entry.external_id) if entry.external_id else None
    return SourceItem(
        read_item(ImportStage(entry.stage), key, entry.payload),
        entry.entry_id,
        entry.attempt_count,
        entry.next_attempt_at,
    )


# ---------------------------------------------------------------- the import's runs and pages


@dataclass
class PageRow:
    page: ImportPage
    status: PageStatus = PageStatus.PENDING
    available_at: datetime | None = None
    error: str | None = None
    counters: StageCounters = field(default_factory=StageCounters)


class MemoryDryRun:
    def __init__(self) -> None:
        self.company_states: dict[UUID, CompanyState] = {}
        self.user_states: dict[UUID, UserState] = {}
        self.phone_users: dict[str, UUID] = {}

    def companies(self, tenant_ids: Sequence[UUID]) -> dict[UUID, CompanyState]:
        return {t: s for t, s in self.company_states.items() if t in tenant_ids}

    def users(self, talent_ids: Sequence[UUID]) -> dict[UUID, UserState]:
        return {t: s for t, s in self.user_states.items() if t in talent_ids}

    def phones(self, phones: Sequence[str]) -> dict[str, UUID]:
        return {p: u for p, u in self.phone_users.items() if p in phones}

    def remember(
        self, stage: str, states: Mapping[UUID, CompanyState | UserState], phones: Mapping[str, UUID]
    ) -> None:
        for talent_id, state in states.items():
            if isinstance(state, CompanyState):
                self.company_states[talent_id] = state
            else:
                self.user_states[talent_id] = state
        self.phone_users.update(phones)

    @property
    def tenant_ids(self) -> set[UUID]:
        return set(self.company_states)


class MemoryPageTransaction:
    def __init__(self, store: MemoryImportStore):
        self.replica = MemoryReplicaTransaction(store.replica)
        self._store = store
        self._completed: list[tuple[ImportPage, StageCounters, bool]] = []

    def complete_page(self, page: ImportPage, counters: StageCounters, *, count_planned: bool) -> None:
        self._store.check_claim(page)
        self._completed.append((page, counters, count_planned))

    def commit(self) -> None:
        self.replica.commit()
        for page, counters, count_planned in self._completed:
            self._store.complete(page, counters, count_planned=count_planned)

    def dry_run_memory(self, run_id: UUID) -> MemoryDryRun:
        return self._store.dry_runs.setdefault(run_id, MemoryDryRun())

    def talent_users_of_tenant(self, tenant_id: UUID, user_ids: Sequence[UUID]) -> set[UUID]:
        company = self.replica.state.companies.get(tenant_id)
        return {
            talent_id
            for talent_id, user in self.replica.state.users.items()
            if company and user.company_id == company.company_id and talent_id in user_ids
        }


@dataclass
class MemoryImportStore:
    replica: MemoryReplica = field(default_factory=MemoryReplica)
    runs: dict[UUID, ImportRun] = field(default_factory=dict)
    pages: list[PageRow] = field(default_factory=list)
    dry_runs: dict[UUID, MemoryDryRun] = field(default_factory=dict)
    lease_lost: bool = False  # the next page transaction finds its claim taken over

    def start(self, mode: ImportMode = ImportMode.API_PULL, **fields: Any) -> ImportRun:
        return self.create_run(ImportRequest(mode, **fields), uuid.uuid4(), datetime.now(UTC))

    def running_run(self) -> ImportRun | None:
        return next((r for r in self.runs.values() if r.status is RunStatus.RUNNING), None)

    def load_run(self, run_id: UUID) -> ImportRun | None:
        return self.runs.get(run_id)

    def latest_run(self) -> ImportRun | None:
        return max(self.runs.values(), key=lambda r: r.started_at, default=None)

    def create_run(self, request: ImportRequest, correlation_id: UUID, now: datetime) -> ImportRun:
        run = ImportRun(
            uuid.uuid4(), request.mode, RunStatus.RUNNING, request.tenant_filter, request.page_size,
            request.dry_run, correlation_id, now, None, StageCounters(), StageCounters(),
        )  # fmt: skip
        self.runs[run.run_id] = run
        return run

    def replica_company_count(self, tenant_filter: UUID | None) -> int:
        return len(self.replica.state.companies)

    def add_planned_pages(self, run: ImportRun, stage: ImportStage, step: PlanStep) -> bool:
        current = self.runs[run.run_id]
        listed = current.tenants_listed if stage is ImportStage.TENANTS else current.users_listed
        where = (current.status, current.plan_page_no, current.plan_cursor)
        if listed or where != (RunStatus.RUNNING, run.plan_page_no, run.plan_cursor):
            return False  # a stale view of the run
        for planned in step.pages:
            self.pages.append(
                PageRow(
                    ImportPage(
                        uuid.uuid4(), run.run_id, stage, planned.page_no, planned.cursor, 0, uuid.uuid4()
                    )
                )
            )
        items = sum(p.items_planned for p in step.pages)
        counters = current.companies if stage is ImportStage.TENANTS else current.users
        counters = replace(counters, planned=counters.planned + items)
        self.runs[run.run_id] = replace(
            current,
            companies=counters if stage is ImportStage.TENANTS else current.companies,
            users=counters if stage is ImportStage.USERS else current.users,
            tenants_listed=current.tenants_listed or (stage is ImportStage.TENANTS and step.complete),
            users_listed=current.users_listed or (stage is ImportStage.USERS and step.complete),
            plan_cursor=step.next_cursor,
            plan_page_no=0 if step.complete else run.plan_page_no + len(step.pages),
        )
        return True

    def progress(self, run_id: UUID) -> PageProgress:
        counts: dict[tuple[ImportStage, PageStatus], int] = {}
        for row in self.pages:
            if row.page.run_id == run_id:
                counts[(row.page.stage, row.status)] = counts.get((row.page.stage, row.status), 0) + 1
        return PageProgress(counts)

    def page_cursors(self, run_id: UUID, stage: ImportStage) -> list[str | None]:
        return [r.page.cursor for r in self.pages if r.page.run_id == run_id and r.page.stage is stage]

    def stage_times(self, run_id: UUID, stage: ImportStage) -> tuple[datetime, datetime] | None:
        return None  # pages kept in memory have no times: no stage span

    def finish_run(self, run_id: UUID, ending: RunEnding, now: datetime) -> bool:
        run = self.runs.get(run_id)
        if run is None or run.status is not RunStatus.RUNNING:
            return False
        self.runs[run_id] = replace(
            run, status=ending.status, finished_at=now, error_code=ending.error_code, error=ending.error
        )
        return True

    def _running(self, run_id: UUID | None) -> list[PageRow]:
        return [
            r
            for r in self.pages
            if self.runs[r.page.run_id].status is RunStatus.RUNNING and run_id in (None, r.page.run_id)
        ]

    def fail_exhausted(self, now: datetime, max_attempts: int) -> int:
        spent = [
            r
            for r in self._running(None)
            if r.status is PageStatus.PENDING and r.page.attempt >= max_attempts
        ]
        for row in spent:
            row.status = PageStatus.FAILED
        return len(spent)

    def claim(
        self, claim_id: UUID, now: datetime, lease_until: datetime, run_id: UUID | None
    ) -> ImportPage | None:
        running = self._running(run_id)
        free = [
            r
            for r in running
            if r.status is PageStatus.PENDING and (r.available_at is None or r.available_at <= now)
        ]
        free.sort(key=lambda r: (r.page.stage is ImportStage.USERS, r.page.page_no))
        if not free:
            return None
        row = free[0]
        row.page = replace(row.page, attempt=row.page.attempt + 1, claim_id=claim_id)
        row.status = PageStatus.IN_PROGRESS
        return row.page

    @contextmanager
    def page_transaction(
        self, page: ImportPage, now: datetime, lease_until: datetime
    ) -> Iterator[MemoryPageTransaction]:
        self.check_claim(page)
        yield MemoryPageTransaction(self)

    def release(
        self, page: ImportPage, now: datetime, release: Release, max_attempts: int
    ) -> PageStatus | None:
        row = self.row(page)
        spent = release.count_attempt and page.attempt >= max_attempts
        row.status = PageStatus.FAILED if spent else PageStatus.PENDING
        if not release.count_attempt:
            row.page = replace(row.page, attempt=max(row.page.attempt - 1, 0))
        row.available_at, row.error = release.available_at, release.error or row.error
        return row.status

    # ---------------------------------------------------------------- for the fake's own use and the tests

    def row(self, page: ImportPage) -> PageRow:
        return next(r for r in self.pages if r.page.page_id == page.page_id)

    def statuses(self, stage: ImportStage | None = None) -> list[PageStatus]:
        return [r.status for r in self.pages if stage is None or r.page.stage is stage]

    def check_claim(self, page: ImportPage) -> None:
        row = self.row(page)
        if self.lease_lost or row.page.claim_id != page.claim_id or row.status is not PageStatus.IN_PROGRESS:
            raise LeaseLostError(str(page.page_id))

    def complete(self, page: ImportPage, counters: StageCounters, *, count_planned: bool) -> None:
        row = self.row(page)
        row.status, row.counters = PageStatus.DONE, counters
        run = self.runs[page.run_id]
        stage_counters = run.companies if page.stage is ImportStage.TENANTS else run.users
        added = StageCounters(
            stage_counters.planned + (counters.planned if count_planned else 0),
            stage_counters.applied + counters.applied,
            stage_counters.skipped + counters.skipped,
            stage_counters.failed + counters.failed,
        )
        if page.stage is ImportStage.TENANTS:
            self.runs[page.run_id] = replace(run, companies=added)
        else:
            self.runs[page.run_id] = replace(run, users=added)


@dataclass
class MemoryRunLock:
    """The one-run lock; `taken_by_another` says another process holds it, `session_died` that our session
    (and with it the lock) is gone. Counts how often it was asked for and let go of."""

    held_by_us: bool = False
    taken_by_another: bool = False
    session_died: bool = False
    acquisitions: int = 0
    releases: int = 0

    def try_acquire(self) -> bool:
        self.acquisitions += 1
        if self.taken_by_another:
            return False
        self.held_by_us, self.session_died = True, False
        return True

    def held(self) -> bool:
        return self.held_by_us and not self.session_died

    def release(self) -> None:
        self.releases += 1
        self.held_by_us = False

    def holder(self) -> str | None:
        return "pin-identity talent-import elsewhere" if self.taken_by_another else None


@dataclass
class MemorySource:
    """Talent's listing as an API serves it: a page is an offset into a stage's items (None: the first)."""

    tenants: list[TalentItem] = field(default_factory=list)
    users: list[TalentItem] = field(default_factory=list)
    unavailable_plans: int = 0  # how many listing calls still fail
    unreadable: set[ImportStage] = field(default_factory=set)
    rejected: bool = False
    unavailable: bool = False  # check() refuses, as before a run starts
    handed_over: list[list[str | None]] = field(default_factory=list)
    plans: list[ImportStage] = field(default_factory=list)
    closed: bool = False

    def check(self) -> None:
        if self.unavailable:
            raise SourceUnavailableError("Talent API: HTTP 503")

    def count_companies(self, tenant_filter: UUID | None) -> int | None:
        return len(self.tenants)

    def plan(
        self, stage: ImportStage, cursor: str | None, page_no: int, page_size: int, tenant_filter: UUID | None
    ) -> PlanStep:
        self.plans.append(stage)
        self._refuse()
        if self.unavailable_plans:
            self.unavailable_plans -= 1
            raise SourceUnavailableError("Talent API: HTTP 503")
        start = int(cursor or 0)
        count = len(self._items(stage)[start : start + page_size])
        following = start + page_size if start + page_size < len(self._items(stage)) else None
        pages = [PlannedPage(page_no, cursor, count)] if count else []
        return PlanStep(pages, str(following) if following is not None else None, complete=following is None)

    def read(
        self, stage: ImportStage, cursor: str | None, page_size: int, tenant_filter: UUID | None
    ) -> list[TalentItem]:
        self._refuse()
        if stage in self.unreadable:
            raise SourceUnavailableError("Talent API: HTTP 503")
        start = int(cursor or 0)
        return self._items(stage)[start : start + page_size]

    def handover(self, cursors: Sequence[str | None]) -> None:
        self.handed_over.append(list(cursors))

    def close(self) -> None:
        self.closed = True

    def _items(self, stage: ImportStage) -> list[TalentItem]:
        return self.tenants if stage is ImportStage.TENANTS else self.users

    def _refuse(self) -> None:
        if self.rejected:
            raise SourceRejectedError("Talent API rejected the token: HTTP 401")


# ---------------------------------------------------------------- the consumer's stream


@dataclass
class MemoryStream:
    """The consumer's view of Talent's topics over records in memory; remembers what it committed."""

    records: list[TalentRecord] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    rewound: int = 0
    closed: bool = False
    written_at: dict[int, datetime] = field(default_factory=dict)  # by offset: the records' timestamps

    def publish(self, *items: TalentItem, at: datetime | None = None) -> None:
        offset = len(self.committed) + len(self.records)
        self.records += [TalentRecord(f"talent.{i.stage}", 0, offset + n, i) for n, i in enumerate(items)]
        self.written_at.update({offset + n: at or datetime.now(UTC) for n in range(len(items))})

    def poll(self, max_records: int, timeout_s: float) -> list[TalentRecord]:
        taken, self.records = self.records[:max_records], self.records[max_records:]
        return taken

    def commit(self, records: Sequence[TalentRecord]) -> None:
        self.committed.extend(record.offset for record in records)

    def rewind(self, records: Sequence[TalentRecord]) -> None:
        self.rewound += 1
        self.records = [*records, *self.records]

    def recommit(self) -> int | None:
        return None  # its commits are never lost

    def lag(self) -> dict[tuple[str, int], int] | None:
        return {("talent", 0): len(self.records)}

    def unapplied_since(self, behind: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], datetime]:
        if not behind.get(("talent", 0)) or not self.records:
            return {}
        return {("talent", 0): self.written_at[self.records[0].offset]}

    def positions(self) -> dict[tuple[str, int], tuple[int, int]]:
        following = self.records[0].offset if self.records else len(self.committed)
        return {("talent", 0): (following, len(self.records))}

    def close(self) -> None:
        self.closed = True

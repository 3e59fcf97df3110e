"""The initial import's own vocabulary: request, run, page, result (talent-initial-import, CONTRACTS 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import ClassVar
from uuid import UUID

from pin_identity.domain.errors import IdentityError
from pin_identity.domain.talent import ImportStage

MAX_PAGE_SIZE = 2000
RUN_LOCK_KEY = "Pin:lock:job:identity-talent-initial-import"
# The pre-flight guard: a source listing fewer companies than this share of the replica is suspicious.
TRUNCATED_SOURCE_SHARE = 0.5


class ImportMode(StrEnum):
    API_PULL = "ApiPull"
    TOPIC_REPLAY = "TopicReplay"

    @classmethod
    def parse(cls, text: str) -> ImportMode:
        """`api-pull`/`topic-replay` (command line) or `ApiPull`/`TopicReplay` (database, HTTP API)."""
        spelled = {"api-pull": cls.API_PULL, "topic-replay": cls.TOPIC_REPLAY}
        if text in spelled:
            return spelled[text]
        try:
            return cls(text)
        except ValueError:
            raise ImportInvalidRequestError(f"mode must be api-pull or topic-replay, not {text!r}") from None


class RunStatus(StrEnum):
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class PageStatus(StrEnum):
    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    DONE = "Done"
    FAILED = "Failed"


class ImportErrorCode(StrEnum):
    ALREADY_RUNNING = "IDENTITY_IMPORT_ALREADY_RUNNING"
    SOURCE_UNAVAILABLE = "IDENTITY_IMPORT_SOURCE_UNAVAILABLE"
    SOURCE_INCOMPLETE = "IDENTITY_IMPORT_SOURCE_INCOMPLETE"
    INVALID_REQUEST = "IDENTITY_IMPORT_INVALID_REQUEST"
    RESUME_MISMATCH = "IDENTITY_IMPORT_RESUME_MISMATCH"
    PAGES_FAILED = "IDENTITY_IMPORT_PAGES_FAILED"
    PLANNING_FAILED = "IDENTITY_IMPORT_PLANNING_FAILED"


@dataclass(frozen=True)
class RunEnding:
    """How a run ends: its last status and, for a failure, the code and the words operators see."""

    status: RunStatus
    code: ImportErrorCode | None = None
    error: str | None = None

    @classmethod
    def completed(cls) -> RunEnding:
        return cls(RunStatus.COMPLETED)

    @classmethod
    def cancelled(cls) -> RunEnding:
        return cls(RunStatus.CANCELLED)

    @classmethod
    def failed(cls, code: ImportErrorCode, error: str) -> RunEnding:
        return cls(RunStatus.FAILED, code, error or None)

    @property
    def error_code(self) -> str | None:
        return self.code.value if self.code else None


class ImportRefusedError(IdentityError):
    """The import did not start (or resume): nothing was written. Raised as one of the subclasses below, whose
    `code` (an ImportErrorCode) says why; each code is one subclass's."""

    code: ClassVar[ImportErrorCode]


class ImportInvalidRequestError(ImportRefusedError):
    code = ImportErrorCode.INVALID_REQUEST


class ImportResumeMismatchError(ImportRefusedError):
    """A Running run continues only with the same mode, tenant filter, page size and dry-run flag."""

    code = ImportErrorCode.RESUME_MISMATCH


class ImportAlreadyRunningError(ImportRefusedError):
    code = ImportErrorCode.ALREADY_RUNNING


class ImportSourceUnavailableError(ImportRefusedError):
    code = ImportErrorCode.SOURCE_UNAVAILABLE


class ImportSourceIncompleteError(ImportRefusedError):
    """The source lists markedly fewer companies than the replica holds (`--force` overrides)."""

    code = ImportErrorCode.SOURCE_INCOMPLETE


@dataclass(frozen=True)
class ImportRequest:
    mode: ImportMode
    tenant_filter: UUID | None = None
    page_size: int = 500
    dry_run: bool = False
    correlation_id: UUID | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise ImportInvalidRequestError(f"page size must be 1..{MAX_PAGE_SIZE}, not {self.page_size}")

    def differs_from(self, run: ImportRun) -> list[str]:
        """What a resume would change: a Running run continues only with the same shape."""
        differences = []
        if self.mode is not run.mode:
            differences.append(f"mode {run.mode.value}")
        if self.tenant_filter != run.tenant_filter:
            differences.append(f"tenant filter {run.tenant_filter}")
        if self.page_size != run.page_size:
            differences.append(f"page size {run.page_size}")
        if self.dry_run != run.dry_run:
            differences.append(f"dry run {run.dry_run}")
        return differences


@dataclass(frozen=True)
class StageCounters:
    planned: int = 0
    applied: int = 0
    skipped: int = 0
    failed: int = 0


@dataclass(frozen=True)
class ImportRun:
    run_id: UUID
    mode: ImportMode
    status: RunStatus
    tenant_filter: UUID | None
    page_size: int
    dry_run: bool
    correlation_id: UUID
    started_at: datetime
    finished_at: datetime | None
    companies: StageCounters
    users: StageCounters
    tenants_listed: bool = False
    users_listed: bool = False
    plan_cursor: str | None = None
    plan_page_no: int = 0
    error_code: str | None = None
    error: str | None = None

    @property
    def planning_stage(self) -> ImportStage | None:
        """The stage still being listed, None once both are planned."""
        if not self.tenants_listed:
            return ImportStage.TENANTS
        if not self.users_listed:
            return ImportStage.USERS
        return None


@dataclass(frozen=True)
class ImportPage:
    """A claimed page: its claim fences every write of this lease."""

    page_id: UUID
    run_id: UUID
    stage: ImportStage
    page_no: int
    cursor: str | None
    attempt: int
    claim_id: UUID


@dataclass(frozen=True)
class PlannedPage:
    page_no: int
    cursor: str | None
    items_planned: int


@dataclass(frozen=True)
class PlanStep:
    """One step of listing a stage: the pages found and where the listing continues; a complete step's
    `next_cursor` is where the next stage starts (None: from the beginning)."""

    pages: list[PlannedPage] = field(default_factory=list)
    next_cursor: str | None = None
    complete: bool = False


@dataclass(frozen=True)
class PageProgress:
    """Pages of a run by stage and status, for `talent-import status` and the end-of-run check."""

    counts: dict[tuple[ImportStage, PageStatus], int]

    def count(self, stage: ImportStage | None = None, status: PageStatus | None = None) -> int:
        return sum(
            n
            for (page_stage, page_status), n in self.counts.items()
            if (stage is None or page_stage is stage) and (status is None or page_status is status)
        )

    def open_pages(self, stage: ImportStage | None = None) -> int:
        return self.count(stage, PageStatus.PENDING) + self.count(stage, PageStatus.IN_PROGRESS)

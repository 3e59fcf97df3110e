"""ApiPull: Talent's HTTP API as the import's source; a page is an API cursor (None: the first page)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from pin_identity.adapters.talent_http.client import (
    TalentApiClient,
    TalentPage,
    TalentSourceError,
    TalentSourceRejectedError,
)
from pin_identity.domain.talent import ImportStage, RawSnapshot
from pin_identity.domain.talent_import import MAX_PAGE_SIZE, PlannedPage, PlanStep
from pin_identity.jobs.ports import SourceRejectedError, SourceUnavailableError


def _translated(exc: TalentSourceError) -> SourceUnavailableError:
    if isinstance(exc, TalentSourceRejectedError):
        return SourceRejectedError(f"Talent API rejected the token: {exc}")
    return SourceUnavailableError(f"Talent API: {exc}")


def page_item(item: Any, stage: ImportStage) -> RawSnapshot:
    """The item's own id is its key; anything that is not an object goes to quarantine as it came."""
    id_field = "tenantId" if stage is ImportStage.TENANTS else "userId"
    key = item.get(id_field) if isinstance(item, dict) else None
    return RawSnapshot(str(key) if key is not None else None, item)


class ApiPullSource:
    def __init__(self, client: TalentApiClient):
        self._client = client

    def _list(
        self, stage: ImportStage, limit: int, cursor: str | None, tenant_filter: UUID | None
    ) -> TalentPage:
        listing = self._client.list_tenants if stage is ImportStage.TENANTS else self._client.list_users
        try:
            return listing(limit, cursor, tenant_filter)
        except TalentSourceError as exc:
            raise _translated(exc) from None

    def check(self) -> None:
        try:
            self._client.health()
        except TalentSourceError as exc:
            raise _translated(exc) from None

    def count_companies(self, tenant_filter: UUID | None) -> int | None:
        count, cursor = 0, None
        while True:
            page = self._list(ImportStage.TENANTS, MAX_PAGE_SIZE, cursor, tenant_filter)
            count += sum(1 for item in page.items if not (isinstance(item, dict) and item.get("isDeleted")))
            if page.next_cursor is None:
                return count
            cursor = page.next_cursor

    def plan(
        self, stage: ImportStage, cursor: str | None, page_no: int, page_size: int, tenant_filter: UUID | None
    ) -> PlanStep:
        """One listing call: the page starting at `cursor`, and where the listing goes on."""
        page = self._list(stage, page_size, cursor, tenant_filter)
        pages = [PlannedPage(page_no, cursor, len(page.items))] if page.items else []
        return PlanStep(pages, page.next_cursor, complete=page.next_cursor is None)

    def read(
        self, stage: ImportStage, cursor: str | None, page_size: int, tenant_filter: UUID | None
    ) -> list[RawSnapshot]:
        return [page_item(item, stage) for item in self._list(stage, page_size, cursor, tenant_filter).items]

    def handover(self, cursors: Sequence[str | None]) -> None:
        return None  # nothing to hand over: the continuous consumer keeps its own offsets

    def close(self) -> None:
        self._client.close()

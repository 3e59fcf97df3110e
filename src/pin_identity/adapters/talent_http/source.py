"""ApiPull: Talent's HTTP API as the import's source; a page is an API cursor (None: the first page). The
client raises the port's errors (SourceUnavailableError, SourceRejectedError) itself."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from pin_identity.adapters.talent_http.client import TalentApiClient, TalentPage
from pin_identity.adapters.talent_wire import api_item
from pin_identity.domain.import_run import MAX_PAGE_SIZE, PlannedPage, PlanStep
from pin_identity.domain.talent import ImportStage, TalentItem, TenantSnapshot


class ApiPullSource:
    def __init__(self, client: TalentApiClient):
        self._client = client

    def _list(
        self, stage: ImportStage, limit: int, cursor: str | None, tenant_filter: UUID | None
    ) -> TalentPage:
        listing = self._client.list_tenants if stage is ImportStage.TENANTS else self._client.list_users
        return listing(limit, cursor, tenant_filter)

    def check(self) -> None:
        self._client.health()

    def count_companies(self, tenant_filter: UUID | None) -> int | None:
        count, cursor = 0, None
        while True:
            page = self._list(ImportStage.TENANTS, MAX_PAGE_SIZE, cursor, tenant_filter)
            count += sum(1 for item in page.items if not _deleted(api_item(ImportStage.TENANTS, item)))
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
    ) -> list[TalentItem]:
        return [api_item(stage, item) for item in self._list(stage, page_size, cursor, tenant_filter).items]

    def handover(self, cursors: Sequence[str | None]) -> None:
        return None  # nothing to hand over: the continuous consumer keeps its own offsets

    def close(self) -> None:
        self._client.close()


def _deleted(item: TalentItem) -> bool:
    return isinstance(item.snapshot, TenantSnapshot) and item.snapshot.is_deleted

"""Talent's sources: where an import reads snapshots (TalentSource, checked before a run starts through its
narrower SourceCheck), and the continuous consumer's stream of the Talent topics (TalentStream)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from pin_identity.domain.import_run import PlanStep
from pin_identity.domain.talent import ImportStage, TalentItem


class SourceCheck(Protocol):
    """What starting a run asks of its source before anything is written."""

    def check(self) -> None:
        """Raise SourceUnavailableError unless the source can be used."""
        ...

    def count_companies(self, tenant_filter: UUID | None) -> int | None:
        """How many companies the source lists within the scope, None if it cannot tell cheaply."""
        ...

    def close(self) -> None: ...


class TalentSource(SourceCheck, Protocol):
    """Where an import reads Talent's snapshots: the HTTP API (ApiPull) or the compacted topics (TopicReplay).
    Cursors are the source's own: the job stores and hands them back without reading them."""

    def plan(
        self, stage: ImportStage, cursor: str | None, page_no: int, page_size: int, tenant_filter: UUID | None
    ) -> PlanStep: ...
    def read(
        self, stage: ImportStage, cursor: str | None, page_size: int, tenant_filter: UUID | None
    ) -> list[TalentItem]: ...
    def handover(self, cursors: Sequence[str | None]) -> None:
        """After a complete replay: let the continuous consumer resume where the replay ended."""
        ...


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
        """Mark every record up to the last of each partition as consumed (after the database commit), and a
        partition read to its end since the last commit as consumed to its end (past its last record may lie
        what no consumer reads: a transaction's commit marker). With no records, only the latter."""
        ...

    def rewind(self, records: Sequence[TalentRecord]) -> None:
        """Read these records again: their transaction rolled back."""
        ...

    def recommit(self) -> int | None:
        """Commit again, for each assigned partition, the offset after the last record applied where the
        group's committed offset is behind it (a commit that failed or was lost while the coordinator moved,
        and no newer record came to carry it). How many partitions it committed; None when this member has
        applied nothing of its partitions, so nothing was asked."""
        ...

    def lag(self) -> dict[tuple[str, int], int] | None:
        """Records behind the end per assigned partition; None until the group assigned partitions, and
        while the broker cannot say (its group coordinator away)."""
        ...

    def unapplied_since(self, behind: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], datetime]:
        """For each partition `lag()` found records behind on, when Talent wrote the first of them (its record
        timestamp): the oldest record not applied yet. A partition whose records past the committed offset
        cannot be read in time, or hold none a consumer reads (a transaction's marker), is left out."""
        ...

    def positions(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Per assigned partition read from already: the next offset to read, and how many records follow
        it up to the partition's end as last fetched. Known locally: asks no broker (a lost one neither)."""
        ...

    def close(self) -> None: ...

"""What the health summary reads beyond the stores' own figures: dead letters and consumer lag."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pydantic import Field

from pin_identity.domain.api_model import ApiModel


@dataclass(frozen=True)
class DeadLetters:
    """Events the broker refused for good (identity.outbox_dead_letters)."""

    count: int
    newest_failed_at: datetime | None


class PartitionLagView(ApiModel):
    topic: str
    partition: int
    lag: int
    committed_offset: int | None = Field(description="Null when the group has committed nothing there.")


class DeadLetterReads(Protocol):
    def dead_letters(self) -> DeadLetters: ...


class ConsumerLagReader(Protocol):
    """Read from the broker without joining the group: committed offsets against high watermarks."""

    def partition_lags(self, group: str, topics: Sequence[str]) -> list[PartitionLagView]:
        """Every partition of those `topics` that exist; raises BrokerUnavailableError."""
        ...

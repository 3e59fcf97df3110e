"""What the health summary reads beyond the stores' own figures: dead letters and consumer lag."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pin_identity.operations.read_models import DeadLetters, PartitionLagView


class DeadLetterReads(Protocol):
    def dead_letters(self) -> DeadLetters: ...


class ConsumerLagReader(Protocol):
    """Read from the broker without joining the group: committed offsets against high watermarks."""

    def partition_lags(self, group: str, topics: Sequence[str]) -> list[PartitionLagView]:
        """Every partition of those `topics` that exist; raises BrokerUnavailableError."""
        ...

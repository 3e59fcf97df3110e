"""The console's health summary: the database gauges `/metrics` serves (read by the caller, a few seconds old
at most), the outbox's dead letters, and how far the talent-sync consumer group is behind on Talent's topics.
Only a worker running talent-sync has the lag as a gauge; any other process asks the broker."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pin_identity.domain.errors import BrokerUnavailableError
from pin_identity.operations.ports.health_sources import ConsumerLagReader, DeadLetterReads
from pin_identity.operations.read_models import ConsumerLag, DeadLetters, HealthSummary, QueueGauges


class HealthReads:
    def __init__(
        self, dead_letters: DeadLetterReads, lags: ConsumerLagReader, group: str, topics: Sequence[str]
    ):
        self._dead_letters, self._lags = dead_letters, lags
        self._group, self._topics = group, tuple(topics)

    def dead_letters(self) -> DeadLetters:
        return self._dead_letters.dead_letters()

    def consumer_lag(self) -> ConsumerLag:
        """The group's lag, or why the broker did not say: an unanswered broker is part of the health
        summary, not a failure of it."""
        try:
            partitions = self._lags.partition_lags(self._group, self._topics)
        except BrokerUnavailableError as exc:
            return ConsumerLag.unknown(self._group, str(exc))
        return ConsumerLag.measured(self._group, partitions)

    def report(self, queues: QueueGauges, read_at: datetime) -> HealthSummary:
        """The whole summary around the gauges just read."""
        return HealthSummary.of(queues, self.dead_letters(), self.consumer_lag(), read_at)

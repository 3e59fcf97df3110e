"""The one clock tests move by hand: wall time for the jobs, monotonic seconds for what measures intervals."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


@dataclass
class ManualClock:
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    start: datetime = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.now

    def __call__(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        """Seconds since the clock was made, for code that takes a `time.monotonic`-like clock (counted from
        the start, not the epoch, so that advancing by 2.0 reads as exactly 2.0 more)."""
        return (self.now - self.start).total_seconds()

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

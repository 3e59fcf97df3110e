"""The one clock tests move by hand (the Clock port): wall time and monotonic seconds move together."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


@dataclass
class ManualClock:
    wall: datetime = field(default_factory=lambda: datetime.now(UTC))
    start: datetime = field(init=False)

    def __post_init__(self) -> None:
        self.start = self.wall

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        """Seconds since the clock was made (counted from the start, not the epoch, so that advancing by 2.0
        reads as exactly 2.0 more)."""
        return (self.wall - self.start).total_seconds()

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)


class ClockedStop(threading.Event):
    """A stop signal whose waits pass time on the clock at once instead of sleeping: code that waits out a
    while on its stop signal runs through that while without the test taking it."""

    def __init__(self, clock: ManualClock):
        super().__init__()
        self._clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set() and timeout:
            self._clock.advance(timeout)
        return self.is_set()

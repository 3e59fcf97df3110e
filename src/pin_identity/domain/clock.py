"""The time the service reads, one port for both of its clocks: the wall clock for what is recorded or
compared with recorded times (leases, event times, retry times), and a clock that never goes back for how
long something took or when something falls due in this process. Whatever reads the time takes a Clock, so
that a test moves time by hand instead of sleeping."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The present moment, aware and in UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: only the differences between readings count."""
        ...
